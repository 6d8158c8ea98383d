"""`python -m analytics.sla`: the SLA job (analytics/sla/job.py)."""

import sys

from analytics.sla.job import main

sys.exit(main())
