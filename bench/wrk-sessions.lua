-- SPDX-License-Identifier: BSD-2-Clause
-- wrk: trivial cells spread over SESSIONS sessions (env, default 64),
-- each request the next session of its thread, JSON answers; errors are
-- any status but 200 (a 429 counts as one).  CODE (env) is another
-- cell, put into the JSON string as it is (no quotes, no backslashes).
local sessions = tonumber(os.getenv("SESSIONS") or "64")
local code = os.getenv("CODE") or "1 + 1"
local n = 0
local thread_id = 0

function setup(thread)
    thread:set("thread_id", thread_id)
    thread_id = thread_id + 1
end

function init(args)
    n = thread_id * 7919
end

function request()
    n = n + 1
    local body = '{"session":"wrk-' .. (n % sessions) .. '","code":"' .. code .. '"}'
    return wrk.format("POST", nil, {["Content-Type"] = "application/json",
                                    ["Accept"] = "application/json"}, body)
end

local bad = 0
function response(status, headers, body)
    if status ~= 200 then
        bad = bad + 1
    end
end

function done(summary, latency, requests)
    io.write(string.format("requests %d, non-200 %d, socket errors %d, p50 %.2f ms, p99 %.2f ms\n",
        summary.requests, summary.errors.status, summary.errors.connect + summary.errors.read
        + summary.errors.write + summary.errors.timeout,
        latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
