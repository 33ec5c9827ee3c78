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
    -- The days' rows as their hourly rows make them now (fresh), then: a stored row of the
    -- same GPU, day and attribution is updated in place, and only where a figure changed; a
    -- stored row whose attribution no longer appears (the GPU moved, the hours went) is
    -- deleted; a new attribution is inserted. In place, not deleted and inserted again: the
    -- rollup rewrites the open day every minute, and an update that changes no indexed
    -- column is a HOT update, with no index entry written (issue 46). All three statements
    -- of a CTE see the rows as they were before it.
    WITH k AS (
        SELECT DISTINCT u.gpu_id, u.day FROM unnest(p_gpu, p_day) AS u(gpu_id, day)
    ), fresh AS MATERIALIZED (
        SELECT h.gpu_id, k.day, h.node_id, h.pool_id, h.team_id, h.site_id, count(*) AS hours,
               {sums_as}
        FROM k
        JOIN telemetry_hourlyusage h
          ON h.gpu_id = k.gpu_id
         -- The local day's hours by the index (an hour's margin where a midnight falls in a
         -- DST gap), then exactly the hours whose local date is that day.
         AND h.hour >= (k.day::timestamp AT TIME ZONE z) - interval '1 hour'
         AND h.hour < ((k.day + 1)::timestamp AT TIME ZONE z) + interval '1 hour'
         AND (h.hour AT TIME ZONE z)::date = k.day
        GROUP BY h.gpu_id, k.day, h.node_id, h.pool_id, h.team_id, h.site_id
    ), updated AS (
        UPDATE telemetry_dailyusage d
        SET hours = f.hours,
            {fresh_updates}
        FROM fresh f
        WHERE d.gpu_id = f.gpu_id AND d.day = f.day
          AND d.node_id IS NOT DISTINCT FROM f.node_id
          AND d.pool_id IS NOT DISTINCT FROM f.pool_id
          AND d.team_id IS NOT DISTINCT FROM f.team_id
          AND d.site_id IS NOT DISTINCT FROM f.site_id
          AND (d.hours,
               {stored_sums_d})
              IS DISTINCT FROM
              (f.hours,
               {fresh_sums})
    ), gone AS (
        -- No hourly row of the day under the row's attribution any more (the rows fresh is
        -- made of, by the hourly index: fresh itself has none, and this function plans
        -- without hash joins).
        DELETE FROM telemetry_dailyusage d
        USING k
        WHERE d.gpu_id = k.gpu_id AND d.day = k.day
          AND NOT EXISTS (
              SELECT 1 FROM telemetry_hourlyusage h
              WHERE h.gpu_id = d.gpu_id
                AND h.hour >= (d.day::timestamp AT TIME ZONE z) - interval '1 hour'
                AND h.hour < ((d.day + 1)::timestamp AT TIME ZONE z) + interval '1 hour'
                AND (h.hour AT TIME ZONE z)::date = d.day
                AND h.node_id IS NOT DISTINCT FROM d.node_id
                AND h.pool_id IS NOT DISTINCT FROM d.pool_id
                AND h.team_id IS NOT DISTINCT FROM d.team_id
                AND h.site_id IS NOT DISTINCT FROM d.site_id)
    )
    INSERT INTO telemetry_dailyusage (
        gpu_id, day, node_id, pool_id, team_id, site_id, hours,
        {sum_columns})
    SELECT f.gpu_id, f.day, f.node_id, f.pool_id, f.team_id, f.site_id, f.hours,
           {fresh_sums}
    FROM fresh f
    WHERE NOT EXISTS (
        SELECT 1 FROM telemetry_dailyusage d
        WHERE d.gpu_id = f.gpu_id AND d.day = f.day
          AND d.node_id IS NOT DISTINCT FROM f.node_id
          AND d.pool_id IS NOT DISTINCT FROM f.pool_id
          AND d.team_id IS NOT DISTINCT FROM f.team_id
          AND d.site_id IS NOT DISTINCT FROM f.site_id);
    -- The months of those days, the same way from their daily rows (0109_monthlyusage), once
    -- the statement above has written them.
    WITH k AS (
        SELECT DISTINCT u.gpu_id, date_trunc('month', u.day)::date AS month
        FROM unnest(p_gpu, p_day) AS u(gpu_id, day)
    ), fresh AS MATERIALIZED (
        SELECT d.gpu_id, k.month, d.node_id, d.pool_id, d.team_id, d.site_id,
               sum(d.hours) AS hours,
               {sums_as}
        FROM k
        JOIN telemetry_dailyusage d
          ON d.gpu_id = k.gpu_id AND d.day >= k.month
         AND d.day < (k.month + interval '1 month')::date
        GROUP BY d.gpu_id, k.month, d.node_id, d.pool_id, d.team_id, d.site_id
    ), updated AS (
        UPDATE telemetry_monthlyusage m
        SET hours = f.hours,
            {fresh_updates}
        FROM fresh f
        WHERE m.gpu_id = f.gpu_id AND m.month = f.month
          AND m.node_id IS NOT DISTINCT FROM f.node_id
          AND m.pool_id IS NOT DISTINCT FROM f.pool_id
          AND m.team_id IS NOT DISTINCT FROM f.team_id
          AND m.site_id IS NOT DISTINCT FROM f.site_id
          AND (m.hours,
               {stored_sums_m})
              IS DISTINCT FROM
              (f.hours,
               {fresh_sums})
    ), gone AS (
        -- No daily row of the month under the row's attribution any more (by the daily
        -- index, as above).
        DELETE FROM telemetry_monthlyusage m
        USING k
        WHERE m.gpu_id = k.gpu_id AND m.month = k.month
          AND NOT EXISTS (
              SELECT 1 FROM telemetry_dailyusage d
              WHERE d.gpu_id = m.gpu_id AND d.day >= m.month
                AND d.day < (m.month + interval '1 month')::date
                AND d.node_id IS NOT DISTINCT FROM m.node_id
                AND d.pool_id IS NOT DISTINCT FROM m.pool_id
                AND d.team_id IS NOT DISTINCT FROM m.team_id
                AND d.site_id IS NOT DISTINCT FROM m.site_id)
    )
    INSERT INTO telemetry_monthlyusage (
        gpu_id, month, node_id, pool_id, team_id, site_id, hours,
        {sum_columns})
    SELECT f.gpu_id, f.month, f.node_id, f.pool_id, f.team_id, f.site_id, f.hours,
           {fresh_sums}
    FROM fresh f
    WHERE NOT EXISTS (
        SELECT 1 FROM telemetry_monthlyusage m
        WHERE m.gpu_id = f.gpu_id AND m.month = f.month
          AND m.node_id IS NOT DISTINCT FROM f.node_id
          AND m.pool_id IS NOT DISTINCT FROM f.pool_id
          AND m.team_id IS NOT DISTINCT FROM f.team_id
          AND m.site_id IS NOT DISTINCT FROM f.site_id);
END
$fn$;
