from services.auditor.service import main
from shared.service import run_service

raise SystemExit(run_service("auditor", main))
