from services.metadata.service import main
from shared.service import run_service

raise SystemExit(run_service("metadata", main))
