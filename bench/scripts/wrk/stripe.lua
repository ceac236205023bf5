-- Sends the signed Stripe deliveries of the file EVENTS (lines `signature<TAB>body`, from the
-- tools bin `signed_events`) in turn, each once, to the path given as the script's argument.
local deliveries = {}
local next = 1
local path = "/inbox/stripe"

function init(args)
   if args[1] ~= nil then
      path = args[1]
   end
   local file = assert(io.open(os.getenv("EVENTS"), "r"))
   for line in file:lines() do
      local tab = string.find(line, "\t", 1, true)
      deliveries[#deliveries + 1] = {
         signature = string.sub(line, 1, tab - 1),
         body = string.sub(line, tab + 1),
      }
   end
   file:close()
end

function request()
   local delivery = deliveries[next]
   if delivery == nil then
      error("the events file ran out: generate more than the run sends")
   end
   next = next + 1
   return wrk.format("POST", path, {
      ["Content-Type"] = "application/json",
      ["Stripe-Signature"] = delivery.signature,
   }, delivery.body)
end

function done(summary, latency, requests)
   local errors = summary.errors.status + summary.errors.connect + summary.errors.read
      + summary.errors.write + summary.errors.timeout
   io.write(string.format("RESULT requests=%d seconds=%.3f rps=%.1f p50_ms=%.2f p99_ms=%.2f errors=%d\n",
      summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
      latency:percentile(50) / 1000, latency:percentile(99) / 1000, errors))
end
