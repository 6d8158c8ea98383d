#!/usr/bin/env bash
# The SLA job (analytics/sla/job.py; docs/analytics.md) on a Spark cluster, with spark-submit:
# packages analytics/ and shared/ from this checkout as --py-files, reads the events stream of
# the deployment's NATS cluster as the user "sla" (deploy/nats/accounts.conf), and passes
# every other option to the job.
#
#   QUIRE_NATS_URL=nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222 \
#   SLA_PASSWORD_FILE=deploy/nats/keys/sla.password \
#   deploy/spark/submit-sla.sh --master spark://spark-master:7077 -- \
#       --since 2026-11-23T00:00:00Z --until 2026-11-24T00:00:00Z --output hdfs:///quire/sla/
#
# Arguments before `--` go to spark-submit (--master, --deploy-mode, --conf ...), those after
# it to the job (--since, --until, --target-ms, --window, --output, --follow ...).
# Environment:
#   QUIRE_NATS_URL      the NATS servers, comma-separated (as the services' setting)
#   SLA_PASSWORD_FILE   the "sla" user's password (deploy/nats/gen-keys.py writes it), read by
#                       the driver (--password-file: never on a command line); in cluster
#                       deploy mode, a path on the driver's node.
#   SPARK_SUBMIT        spark-submit to use (default: the one on PATH)
# The executors' Python needs pyspark's sql extras (pyarrow, pandas) and nats-py, at the
# versions of constraints.txt: install them on the nodes, or ship an environment
# (--archives env.tar.gz#env --conf spark.pyspark.python=./env/bin/python).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
spark_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    spark_args+=("$1")
    shift
done
[ $# -gt 0 ] && shift  # the "--"
: "${QUIRE_NATS_URL:?set QUIRE_NATS_URL to the NATS servers}"
: "${SLA_PASSWORD_FILE:?set SLA_PASSWORD_FILE to the file of the sla password}"
[ -r "$SLA_PASSWORD_FILE" ] || { echo "cannot read $SLA_PASSWORD_FILE" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The packages as importable top-level folders, without caches.
python3 - "$repo" "$work/quire-analytics.zip" <<'PY'
import os, sys, zipfile
from pathlib import Path

os.chdir(sys.argv[1])
with zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_DEFLATED) as archive:
    for package in ("analytics", "shared"):
        for path in sorted(Path(package).rglob("*.py")):
            archive.write(path)
PY

# Not exec: the trap removes the archive once spark-submit is done with it.
"${SPARK_SUBMIT:-spark-submit}" "${spark_args[@]}" \
    --name quire-sla \
    --py-files "$work/quire-analytics.zip" \
    "$repo/analytics/sla/job.py" \
    --url "$QUIRE_NATS_URL" --user sla --password-file "$SLA_PASSWORD_FILE" \
    "$@"
