-- step.lua: read or write the checkpoint of one step of a running attempt
-- (idem.Step), only if the caller still owns the attempt: compare-and-set
-- on the owner token, as renew.lua and release.lua do.
-- (lua/record.lua, prepended, describes the record and its helpers.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- KEYS[2]  its checkpoints, the hash <prefix>:{<key>}:steps (same slot):
--          field = a step's name (never empty), value = its checkpoint:
--          "d" and the step's result (msgpack), or "f" and its permanent
--          error (the payload of a failed record); field "" = the bytes
--          that the names and checkpoints stored take, in decimal
-- ARGV[1]  the caller's owner token
-- ARGV[2]  the step's name
-- ARGV[3]  the checkpoint to store, or "" to read the stored one
-- ARGV[4]  the most bytes the names and checkpoints may take once this one
--          is stored, in decimal; "0" for no limit (failures: small, and
--          always stored). Ignored by a read.
--
-- Unless KEYS[1] holds a record in progress ("p") whose owner is ARGV[1],
-- nothing is read or written and the reply is 0: the caller's attempt
-- ended (another caller took over, it was released or finished, the
-- record is gone or is not a record). Otherwise the hash's TTL becomes
-- the record's (PTTL; none if the record has none), as renew.lua and a
-- takeover in claim.lua make it: the checkpoints live as long as the
-- record, however long fn runs after them, and never outlive it, so a
-- claim of an absent key (attempt 1) finds none of an earlier life of the
-- key, and needs no read.
--
-- Read (ARGV[3] == ""): returns the checkpoint stored under the name, or
-- "" when there is none.
-- Write: returns
--   1  stored; or these exact bytes are stored under the name already (a
--      write re-sent after its reply was lost)
--   2  not stored: the names and checkpoints would take more than ARGV[4]
--   3  not stored: another checkpoint is stored under the name. A
--      checkpoint, once stored, is never replaced: a step is checkpointed
--      at most once per life of the key.
if ARGV[2] == '' then
  return redis.error_reply('idem: step: empty name')
end
local s = get(KEYS[1])
if not s then
  return 0
end
local st, _, own = parse(s)
if st ~= 'p' or own ~= ARGV[1] then
  return 0
end
local function keep()
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[2], ttl)
  else
    redis.call('PERSIST', KEYS[2])
  end
end
local old = redis.call('HGET', KEYS[2], ARGV[2])
if ARGV[3] == '' then
  keep()
  return old or ''
end
if old then
  if old == ARGV[3] then
    keep()
    return 1
  end
  return 3
end
local size = (count(redis.call('HGET', KEYS[2], '') or '0') or 0) + #ARGV[2] + #ARGV[3]
local limit = count(ARGV[4])
if not limit then
  return redis.error_reply('idem: step: malformed limit')
end
if limit > 0 and size > limit then
  return 2
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3], '', string.format('%d', size))
keep()
return 1
