-- complete.lua: record the outcome of an attempt, only if the caller still
-- owns it (compare-and-set on the owner token), and wake the waiters.
-- (lua/record.lua, prepended, describes the record and its helpers.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- KEYS[2]  its notification channel, <prefix>:{<key>}:done (same slot)
-- ARGV[1]  owner token
-- ARGV[2]  outcome state: "d" (result) or "f" (permanent error)
-- ARGV[3]  the result bytes (for "d") or the error message (for "f")
-- ARGV[4]  retention in milliseconds (the record's TTL from now on)
-- ARGV[5]  the publish command, "PUBLISH" or "SPUBLISH"; "" publishes nothing
--
-- Returns 1 when the outcome is stored (a repeat with the same token after a
-- success is a no-op that also returns 1), and 0 when the caller no longer
-- owns the record: another caller took over, it was released, or it is gone.
local s = get(KEYS[1])
if not s then
  return 0
end
local st, _, own, _, i = parse(s)
if own ~= ARGV[1] then
  return 0
end
if st ~= 'p' then
  return st == ARGV[2] and 1 or 0
end
-- The header (fp, owner, attempt) is kept; the tail becomes the payload.
redis.call('SET', KEYS[1], '1' .. ARGV[2] .. string.sub(s, 3, i) .. ARGV[3], 'PX', ARGV[4])
if ARGV[5] ~= '' then
  redis.call(ARGV[5], KEYS[2], ARGV[2])
end
return 1
