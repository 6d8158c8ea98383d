"""A local Spark session for the tests: started once per test session (it takes 11-18 s here),
with the `jetstream` data source registered, and its JVM ended with the session."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def start_spark(directory: Path) -> Any:
    # The Python workers must run this interpreter (it has the project installed) and
    # connect back over loopback, or they fail with "Python worker failed to connect back".
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from analytics.jetstream import JetStreamDataSource

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("quire-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.local.dir", str(directory / "local"))
        .config("spark.sql.streaming.checkpointLocation", str(directory / "checkpoints"))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={directory}")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(JetStreamDataSource)
    return spark


def stop_spark(spark: Any) -> None:
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        # The JVM ends when its stdin (our pipe) closes.
        gateway.proc.stdin.close()
        gateway.proc.wait(timeout=60)
        SparkContext._gateway = None
        SparkContext._jvm = None
