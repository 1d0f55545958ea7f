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
-- The in-progress hash is replaced by the finished string form.
local t = kind(KEYS[1])
if t == 'string' then
  local st, _, own = finished(redis.call('GET', KEYS[1]))
  if st == ARGV[2] and own == ARGV[1] then
    return 1
  end
  return 0
end
if t ~= 'hash' then
  return 0
end
local r = redis.call('HMGET', KEYS[1], 'own', 'st', 'fp', 'n')
if r[1] ~= ARGV[1] or r[2] ~= 'p' or not r[3] or not tonumber(r[4]) then
  return 0
end
-- One write: Redis does not roll a script back, so a SET of the header and
-- an APPEND of the payload could leave a header alone if the second failed
-- (out of memory), a record "done" with an empty result.
redis.call('SET', KEYS[1], '1' .. ARGV[2] .. string.char(#r[3]) .. r[3] ..
  string.char(#ARGV[1]) .. ARGV[1] .. r[4] .. ':' .. ARGV[3], 'PX', ARGV[4])
if ARGV[5] ~= '' then
  redis.call(ARGV[5], KEYS[2], ARGV[2])
end
return 1
