from services.journal.service import main
from shared.service import run_service

raise SystemExit(run_service("journal", main, instance=lambda s: f"{s.bookie_id}.journal"))
