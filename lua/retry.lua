-- retry.lua: un-park an operation that WithMaxRecoveries parked (Retry): the
-- next recovery, or the next call, runs it again.
-- (lua/record.lua, prepended, describes the record, the stored input and
-- the index.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- KEYS[2]  its steps' checkpoints, <prefix>:{<key>}:steps
-- KEYS[3]  its stored input, <prefix>:{<key>}:in
-- KEYS[4]  its bucket of the index of unfinished operations
-- ARGV[1]  its member there (the key)
--
-- Returns 1 when un-parked (its recoveries counted from 0 again, and due
-- for recovery now); 0 when there is no record; 2 when the record is
-- finished; 3 when the operation is unfinished but not parked; 4 when it
-- is parked at a checked step (that is resolved with Resolve or
-- ResolveNotApplied, not retried).
local s = get(KEYS[1])
if not s then
  return 0
end
local st = parse(s)
if st == 'd' or st == 'f' then
  return 2
end
local pk = redis.call('HGET', KEYS[2], PARKED)
if not pk then
  return 3
end
if pk ~= 'k' then
  return 4
end
redis.call('HDEL', KEYS[2], PARKED)
local _, at = recoveries(KEYS[3])
if at then
  redis.call('SETRANGE', KEYS[3], at, string.char(0))
end
pendingAdd(KEYS[4], ARGV[1], 0, redis.call('PTTL', KEYS[1]))
return 1
