-- renew.lua: extend the lease of a running attempt (the heartbeat), only if
-- the caller still owns it.
-- Model: step Renew in model/idem.pml (renew_script; before fn: step RenewBeforeFn).
-- (lua/record.lua, prepended, describes the record and its helpers.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- KEYS[2]  (optional) its steps' checkpoints, <prefix>:{<key>}:steps (see
--          lua/step.lua): their TTL is reset with the record's, so that
--          they live as long as it does
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds, counted from now
-- ARGV[3]  retention in milliseconds, at least the lease: the TTL is reset
--          to it, so a record never expires under a running attempt
-- KEYS[3], ARGV[4..5]  for a registered operation (Op.Do, or a recovery)
--          only: its bucket of the index of unfinished operations
--          (lua/record.lua), its member there (the key), and the lease plus
--          WithRecoverAfter in milliseconds: it is due for recovery then.
--
-- Returns 1 when renewed, 0 when the caller no longer owns the attempt.
local s = get(KEYS[1])
if not s then
  return 0
end
local st, _, own, _, i = parse(s)
if st ~= 'p' or own ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], string.sub(s, 1, i) ..
  string.format('%d', tonumber(ARGV[3]) - tonumber(ARGV[2])), 'PX', ARGV[3])
if KEYS[2] then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
if KEYS[3] then
  pendingAdd(KEYS[3], ARGV[4], ARGV[5], ARGV[3])
end
return 1
