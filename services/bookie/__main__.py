from services.bookie.cohost import run_cohosted

raise SystemExit(run_cohosted())
