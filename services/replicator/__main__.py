from services.replicator.service import main
from shared.service import run_service

raise SystemExit(run_service("replicator", main))
