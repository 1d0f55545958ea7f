-- release.lua: give up a claim after a transient failure (an error, a panic,
-- an unknown claim outcome), only if the caller still owns it, and wake the
-- waiters so one of them takes over. The attempt number is kept, so the next
-- owner sees a higher one.
-- Model: step Release in model/idem.pml (release_script: the owner's claim only).
-- (lua/record.lua, prepended, describes the record and its helpers.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- KEYS[2]  its notification channel, <prefix>:{<key>}:done (same slot)
-- ARGV[1]  owner token
-- ARGV[2]  the publish command, "PUBLISH" or "SPUBLISH"; "" publishes nothing
-- KEYS[3..5], ARGV[3..5]  for a registered operation (Op.Do, or a recovery)
--          only: its steps' checkpoints, its stored input and its bucket of
--          the index of unfinished operations (lua/record.lua); its member
--          there (the key), WithRecoverAfter in milliseconds, and
--          WithMaxRecoveries. The operation is due for recovery
--          WithRecoverAfter from now, or parked once its recoveries reached
--          WithMaxRecoveries.
--
-- Returns 1 when released, 2 when released and parked, 0 when the caller
-- did not own an in-progress record (nothing is changed then).
local s = get(KEYS[1])
if not s then
  return 0
end
local st, _, own = parse(s)
if st ~= 'p' or own ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], '1r' .. string.sub(s, 3), 'KEEPTTL')
if ARGV[2] ~= '' then
  redis.call(ARGV[2], KEYS[2], 'r')
end
if KEYS[5] then
  local ret = redis.call('PTTL', KEYS[1])
  local r = recoveries(KEYS[4])
  if r and r >= tonumber(ARGV[5]) then
    park(KEYS[1], KEYS[3], KEYS[5], ARGV[3], ret)
    return 2
  end
  pendingAdd(KEYS[5], ARGV[3], ARGV[4], ret)
end
return 1
