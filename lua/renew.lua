-- renew.lua: extend the lease of a running attempt (the heartbeat), only if
-- the caller still owns it.
-- (lua/record.lua, prepended, describes the record and its helpers.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds, counted from now (server time)
-- ARGV[3]  retention in milliseconds: the TTL is reset to it, so a record
--          never expires under a running attempt
--
-- Returns 1 when renewed, 0 when the caller no longer owns the attempt.
local now = serverMs()
if kind(KEYS[1]) ~= 'hash' then
  return 0
end
local r = redis.call('HMGET', KEYS[1], 'own', 'st')
if r[1] ~= ARGV[1] or r[2] ~= 'p' then
  return 0
end
redis.call('HSET', KEYS[1], 'lu', tostring(now + tonumber(ARGV[2])))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
