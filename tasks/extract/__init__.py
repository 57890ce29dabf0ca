"""extract: the Prefect tasks of the extract flows (shard tasks, servers, run hold, plan, report, fan-out)."""
