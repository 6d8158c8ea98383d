from services.ledgerstore.service import main
from shared.service import run_service

raise SystemExit(run_service("ledgerstore", main, instance=lambda s: f"{s.bookie_id}.ledgerstore"))
