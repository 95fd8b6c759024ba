"""The bridge's warm SparkSession and the classic/Connect differences (job groups, status tracker).

``local[*]``/``spark://`` masters give a classic session with a SparkContext: jobs run under a job group
(cancelled with interruptOnCancel) and progress comes from the status tracker. ``sc://`` gives a Spark
Connect session: there is no SparkContext, so progress is the bridge's own phases and counters only and
cancel goes through ``interruptTag``. Both get the same job tag, so cancel works the same way.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from pyspark.sql import SparkSession

from services.spark_bridge.jvm_log import jvm_log_conf, start_jvm

DEFAULT_MASTER = "local[*]"
# pyspark warns about pandas 3 when it loads its pandas helpers; the bridge moves data with Arrow only.
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)


def classic_conf(conf: dict[str, str] | None = None, *, ui: bool = False) -> dict[str, str]:
    """The configuration of a classic session: ours, then the caller's ``conf`` on top.

    The Spark UI is off unless asked for: it listens on every interface and shows job descriptions,
    SQL plans (input paths) and environment to anyone who can reach the port.
    """
    return {
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.scheduler.mode": "FAIR",  # concurrent jobs share executors instead of queueing
        **(conf or {}),
    }


def build_session(
    master: str = DEFAULT_MASTER,
    app_name: str = "qbroker-spark-bridge",
    conf: dict[str, str] | None = None,
    *,
    ui: bool = False,
) -> SparkSession:
    if master.startswith("sc://"):
        # The generic builder (not the Connect class directly) also switches pyspark.sql.functions to
        # Connect mode for this process; a process therefore holds either kind of session, not both.
        remote = SparkSession.builder.remote(master).appName(app_name)
        for key, value in (conf or {}).items():
            remote = remote.config(key, value)
        return remote.getOrCreate()
    # Executors must run the same Python as the driver (standalone workers would pick their own).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    session_conf = jvm_log_conf(classic_conf(conf, ui=ui))
    start_jvm({"spark.master": master, "spark.app.name": app_name, **session_conf})
    for key, value in session_conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def is_classic(spark: SparkSession) -> bool:
    """True when the session has a SparkContext (not Spark Connect)."""
    return not type(spark).__module__.startswith("pyspark.sql.connect")


def job_tag(job_id: str) -> str:
    return f"qbroker-spark-bridge-{job_id}"


def enter_job(spark: SparkSession, job_id: str, description: str) -> None:
    """Mark every Spark job started by this thread from now on as belonging to ``job_id``."""
    tag = job_tag(job_id)
    if is_classic(spark):
        spark.sparkContext.setJobGroup(tag, description, interruptOnCancel=True)
    spark.addTag(tag)


def leave_job(spark: SparkSession, job_id: str) -> None:
    spark.removeTag(job_tag(job_id))
    if is_classic(spark):
        # Worker threads are reused: do not let the next job inherit this group.
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            spark.sparkContext.setLocalProperty(key, None)  # type: ignore[arg-type]


def cancel_job(spark: SparkSession, job_id: str) -> None:
    """Stop the Spark jobs of ``job_id`` now (running tasks are interrupted)."""
    tag = job_tag(job_id)
    if is_classic(spark):
        spark.sparkContext.cancelJobGroup(tag)
    spark.interruptTag(tag)


def spark_progress(spark: SparkSession, job_id: str) -> dict[str, Any] | None:
    """Jobs, stages and tasks of ``job_id`` from the status tracker; None under Spark Connect."""
    if not is_classic(spark):
        return None
    tracker = spark.sparkContext.statusTracker()
    totals = {
        "jobs": 0,
        "jobs_running": 0,
        "stages": 0,
        "stages_active": 0,
        "tasks": 0,
        "tasks_completed": 0,
        "tasks_active": 0,
        "tasks_failed": 0,
    }
    active_stages: list[dict[str, Any]] = []
    for spark_job_id in tracker.getJobIdsForGroup(job_tag(job_id)):
        info = tracker.getJobInfo(spark_job_id)
        if info is None:
            continue
        totals["jobs"] += 1
        totals["jobs_running"] += info.status == "RUNNING"
        for stage_id in info.stageIds:
            stage = tracker.getStageInfo(stage_id)
            if stage is None:
                continue
            totals["stages"] += 1
            totals["tasks"] += stage.numTasks
            totals["tasks_completed"] += stage.numCompletedTasks
            totals["tasks_active"] += stage.numActiveTasks
            totals["tasks_failed"] += stage.numFailedTasks
            if stage.numActiveTasks > 0:
                totals["stages_active"] += 1
                active_stages.append(
                    {
                        "stage_id": stage_id,
                        "name": stage.name,
                        "tasks": stage.numTasks,
                        "completed": stage.numCompletedTasks,
                        "active": stage.numActiveTasks,
                    }
                )
    return {**totals, "active_stages": active_stages}
