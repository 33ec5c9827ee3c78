-- telemetry_dailyusage_refresh (PostgreSQL): recompute the DailyUsage rows of these GPU-days
-- from their hourly rows, then the MonthlyUsage rows of their months from the daily rows.
-- Called by the statement triggers on telemetry_hourlyusage (created in migration
-- 0101_dailyusage), so whatever writes hourly rows, the days and months it touched follow in
-- the same transaction.
--
-- A template: the lists in braces are telemetry.models.USAGE_SUMS and their sums over the
-- hours (telemetry.rollup.daily_refresh_function_sql()). The function is installed by migrations
-- only, each with its text frozen (0103_usage_sums, then one per change of USAGE_SUMS), so that
-- replaying the migrations on a fresh database always installs what they installed then;
-- tests/telemetry/test_usage_sums.py checks that the installed text is this one.
--
-- The keys are a rollup batch's GPU-days (a few thousand at most), each a short index range:
-- without these settings the planner, which cannot see how few keys an array holds, scans
-- the whole hourly table (a second per batch at 2 M rows instead of a few milliseconds).
CREATE OR REPLACE FUNCTION telemetry_dailyusage_refresh(p_gpu bigint[], p_day date[])
RETURNS void LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $fn$
DECLARE
    z text;
BEGIN
    SELECT zone INTO z FROM telemetry_dailyusagestate ORDER BY id LIMIT 1;
    IF z IS NULL THEN
        RETURN;  -- not in use (no state row): the selectors read hourly rows
    END IF;
    -- Delete, then insert: a day whose attribution changed loses its old rows; a day that
    -- lost all its hourly rows ends with none.
    DELETE FROM telemetry_dailyusage d
    USING unnest(p_gpu, p_day) AS k(gpu_id, day)
    WHERE d.gpu_id = k.gpu_id AND d.day = k.day;
    INSERT INTO telemetry_dailyusage (
        gpu_id, day, node_id, pool_id, team_id, site_id, hours,
        {sum_columns})
    SELECT h.gpu_id, k.day, h.node_id, h.pool_id, h.team_id, h.site_id, count(*),
           {sums}
    FROM (SELECT DISTINCT u.gpu_id, u.day FROM unnest(p_gpu, p_day) AS u(gpu_id, day)) k
    JOIN telemetry_hourlyusage h
      ON h.gpu_id = k.gpu_id
     -- The local day's hours by the index (an hour's margin where a midnight falls in a
     -- DST gap), then exactly the hours whose local date is that day.
     AND h.hour >= (k.day::timestamp AT TIME ZONE z) - interval '1 hour'
     AND h.hour < ((k.day + 1)::timestamp AT TIME ZONE z) + interval '1 hour'
     AND (h.hour AT TIME ZONE z)::date = k.day
    GROUP BY h.gpu_id, k.day, h.node_id, h.pool_id, h.team_id, h.site_id;
    -- The months of those days, the same way from their daily rows (0109_monthlyusage).
    DELETE FROM telemetry_monthlyusage m
    USING (SELECT DISTINCT u.gpu_id, date_trunc('month', u.day)::date AS month
           FROM unnest(p_gpu, p_day) AS u(gpu_id, day)) k
    WHERE m.gpu_id = k.gpu_id AND m.month = k.month;
    INSERT INTO telemetry_monthlyusage (
        gpu_id, month, node_id, pool_id, team_id, site_id, hours,
        {sum_columns})
    SELECT d.gpu_id, k.month, d.node_id, d.pool_id, d.team_id, d.site_id, sum(d.hours),
           {sums}
    FROM (SELECT DISTINCT u.gpu_id, date_trunc('month', u.day)::date AS month
          FROM unnest(p_gpu, p_day) AS u(gpu_id, day)) k
    JOIN telemetry_dailyusage d
      ON d.gpu_id = k.gpu_id AND d.day >= k.month
     AND d.day < (k.month + interval '1 month')::date
    GROUP BY d.gpu_id, k.month, d.node_id, d.pool_id, d.team_id, d.site_id;
END
$fn$;
