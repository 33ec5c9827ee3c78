-- Fragment (workload_upsert_conflict in rollup_upsert and rollup_workloads): the workload
-- rows' upsert rewrites only rows whose numbers changed.
ON CONFLICT (workload_id, gpu_id, hour) DO UPDATE SET
    samples = excluded.samples,
    gpu_s = excluded.gpu_s,
    air_s = excluded.air_s,
    energy_j = excluded.energy_j,
    computed_at = excluded.computed_at
    WHERE (
        telemetry_workloadhourlyusage.samples, telemetry_workloadhourlyusage.gpu_s,
        telemetry_workloadhourlyusage.air_s, telemetry_workloadhourlyusage.energy_j
    ) IS DISTINCT FROM (excluded.samples, excluded.gpu_s, excluded.air_s, excluded.energy_j)
