-- wrk script for bench/scripts/coalescing-ab.sh: POST /orders with an Idempotency-Key per
-- request (`new`), or one key per 16 consecutive requests (`hot`).
-- Arguments (after `--`): the mode and a prefix that makes this run's keys its own.
local mode, prefix = "new", "k"
local n = 0
local body = '{"amount":1000,"currency":"usd"}'

function init(args)
  mode = args[1] or mode
  prefix = args[2] or prefix
end

function request()
  n = n + 1
  local key = n
  if mode == "hot" then
    key = math.floor((n - 1) / 16)
  end
  return wrk.format("POST", "/orders", {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = prefix .. "-" .. key,
  }, body)
end
