-- Every daily row again from the hourly rows, in the zone given: one scan, one GROUP BY.
-- Run after the state row names the new zone, in the same transaction.
INSERT INTO telemetry_dailyusage (
    gpu_id, day, node_id, pool_id, team_id, site_id, hours, samples, observed_s, air_s,
    held_s, parked_s, energy_j, idle_energy_j, idle_s, throttle_power_cap_s,
    throttle_thermal_s, throttle_hw_slowdown_s, throttle_other_s, throttle_any_s,
    sm_active_s, sm_observed_s)
SELECT gpu_id, (hour AT TIME ZONE %(zone)s)::date, node_id, pool_id, team_id, site_id,
       count(*), sum(samples), sum(observed_s), sum(air_s), sum(held_s), sum(parked_s),
       sum(energy_j), sum(idle_energy_j), sum(idle_s), sum(throttle_power_cap_s),
       sum(throttle_thermal_s), sum(throttle_hw_slowdown_s), sum(throttle_other_s),
       sum(throttle_any_s), sum(sm_active_s), sum(sm_observed_s)
FROM telemetry_hourlyusage
GROUP BY 1, 2, 3, 4, 5, 6
