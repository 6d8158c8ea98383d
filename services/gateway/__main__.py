from services.gateway.service import main
from shared.service import run_service

raise SystemExit(run_service("gateway", main))
