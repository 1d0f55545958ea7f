-- complete.lua: record the outcome of an attempt, only if the caller still
-- owns it (compare-and-set on the owner token), and wake the waiters.
--
-- KEYS[1]  the record hash, <prefix>:{<key>}
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
local r = redis.call('HMGET', KEYS[1], 'own', 'st')
if r[1] ~= ARGV[1] then
  return 0
end
if r[2] == ARGV[2] then
  return 1
end
if r[2] ~= 'p' then
  return 0
end
local field = 'res'
if ARGV[2] == 'f' then field = 'err' end
redis.call('HSET', KEYS[1], 'st', ARGV[2], field, ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if ARGV[5] ~= '' then
  redis.call(ARGV[5], KEYS[2], ARGV[2])
end
return 1
