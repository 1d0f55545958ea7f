-- complete.lua: record the outcome of an attempt, only if the caller still
-- owns it (compare-and-set on the claim), and wake the waiters.
-- Model: step Complete in model/idem.pml (complete_script: compare-and-set on the owner token).
-- (lua/record.lua, inserted below, describes the record and its helpers.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- KEYS[2]  its notification channel, <prefix>:{<key>}:done (same slot)
-- ARGV[1]  the caller's claim: the record as claim.lua wrote it for the
--          caller (in progress, with its fingerprint, owner token, attempt
--          and lease mark), and as renew.lua keeps it
-- ARGV[2]  the finished record, built by the caller from the same header:
--          state "d" with the result, or "f" with the permanent error's
--          message
-- ARGV[3]  retention in milliseconds (the record's TTL from now on)
-- ARGV[4]  the publish command, "PUBLISH" or "SPUBLISH"; "" publishes nothing
-- KEYS[3], ARGV[5..7]  with tombstones only (see lua/tombstone.lua): the
--          stem of the key's tombstone buckets; the tombstone's field, and
--          the tombstones' span (retention + tombstone time) and window
--          width in milliseconds. The stored record leaves a tombstone
--          with its fingerprint.
-- KEYS[#KEYS-1], KEYS[#KEYS], ARGV[8..9]  for a registered operation
--          (Op.Do, or a recovery) only: the key of its stored input,
--          <prefix>:{<key>}:in, and its bucket of the index of unfinished
--          operations (lua/record.lua); "1", and its member there (the
--          key). Without tombstones ARGV[5..7] are "". The input and the
--          index entry are deleted with the outcome stored: a finished
--          operation keeps neither.
--
-- The notification is the finished record itself when it is at most 4096
-- bytes (the outcome, its fingerprint, owner and attempt: a waiter of that
-- owner's attempt returns it without asking Redis again), else "d" or "f"
-- (a waiter claims again to read it). Either way the record is stored
-- first: a notification is never the only copy of an outcome.
--
-- Returns 1 when the outcome is stored (a repeat with the same token after a
-- success is a no-op that also returns 1), and 0 when the caller no longer
-- owns the record: another caller took over, it was released, or it is gone.
local s = redis.pcall('GET', KEYS[1])
local rec = ARGV[2]
local done = string.sub(rec, 2, 2)
if done ~= 'd' and done ~= 'f' then
  return redis.error_reply('idem: complete: the record to store is not finished')
end
-- The usual case: the record is still the caller's claim, byte for byte
-- (Lua compares its strings by reference), and the finished record is
-- stored as it is, so the payload is not copied in Lua. Otherwise the
-- record has moved on (another owner, released, finished, gone), or the
-- caller's header lacks the fingerprint that the record keeps from an
-- earlier caller (a call without one took the key over): the header is
-- then Redis's, and the payload is copied behind it. Only this case needs
-- the helpers of lua/record.lua, inserted here: defining them (Lua
-- closures) would cost every call.
if s ~= ARGV[1] then
  if type(s) ~= 'string' then
    return 0 -- gone, or not a record
  end

  --[[lua/record.lua]]

  local _, _, token = parse(ARGV[1])
  local st, _, own, _, i = parse(s)
  if not token or own ~= token then
    return 0
  end
  if st ~= 'p' then
    return st == done and 1 or 0
  end
  local _, _, _, _, j = parse(rec)
  if not j then
    return redis.error_reply('idem: complete: malformed record to store')
  end
  rec = '1' .. done .. string.sub(s, 3, i) .. string.sub(rec, j + 1)
end
redis.call('SET', KEYS[1], rec, 'PX', ARGV[3])
if ARGV[4] ~= '' then
  redis.call(ARGV[4], KEYS[2], #rec <= 4096 and rec or done)
end
local inKey = ARGV[8] and KEYS[#KEYS - 1]
if inKey then
  redis.call('DEL', inKey)
  redis.call('ZREM', KEYS[#KEYS], ARGV[9])
end
if KEYS[3] and KEYS[3] ~= inKey then
  --[[lua/tombstone.lua]]
  local fl = string.byte(rec, 3)
  tombWrite(KEYS[3], ARGV[5], string.sub(rec, 4, 3 + math.min(fl, 8)), tonumber(ARGV[6]), tonumber(ARGV[7]))
end
return 1
