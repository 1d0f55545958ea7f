-- claim.lua: claim an idempotency key for one caller, or report its state.
-- Model: step Claim in model/idem.pml (claim_script; the caller's side: step ClaimReply).
-- (lua/record.lua, inserted below, describes the record and its helpers.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- KEYS[2]  its steps' checkpoints, <prefix>:{<key>}:steps (see lua/step.lua):
--          a takeover resets their TTL with the record's, so that they
--          live as long as it does, and looks for a parked operation there.
--          Optional, but idem always sends it: any claim may turn out a
--          takeover, and asking again would cost a takeover a round trip.
-- ARGV[1]  the caller's new claim, as the caller built it: the record of
--          attempt 1 in progress, with the caller's fingerprint digest
--          ("" = not checked), its owner token (random per Do call) and
--          the lease mark, retention - lease (lua/record.lua). It says all
--          the script needs to know of the caller; few arguments keep the
--          call short, and a new key's record is stored as it is.
-- ARGV[2]  retention in milliseconds (the record's TTL), at least the lease
-- ARGV[3]  "1" to return a finished record with its PTTL (for its age);
--          a plain claim leaves it out unless observers want ages
-- KEYS[3], ARGV[4..5]  with tombstones only (see lua/tombstone.lua): the
--          stem of the key's tombstone buckets; the tombstone's field, and
--          the first 8 bytes of the caller's fingerprint digest ("" = not
--          checked). The tombstone is looked for in the windows of every
--          span that left tombstones, not only the caller's.
-- KEYS[#KEYS-1], KEYS[#KEYS], ARGV[6..9]  for a registered operation
--          (Op.Do, or a recovery) only: the key of its stored input,
--          <prefix>:{<key>}:in, and of its bucket of the index of unfinished
--          operations (lua/record.lua, "The index"); the input as stored
--          (lua/record.lua), or "" for a recovery, which keeps it; the
--          index's member (the key); WithRecoverAfter in milliseconds; and
--          for a recovery only, WithMaxRecoveries ("" for Op.Do). Without
--          tombstones ARGV[4..5] are "". A claim stores the input beside the
--          record, with the record's TTL, and indexes the operation as due
--          when its lease and WithRecoverAfter have passed, in the same
--          round trip. A recovery counts itself in the input's header; one
--          beyond WithMaxRecoveries parks the operation instead.
--
-- Returns one of (the usual answers are scalars: Redis converts a Lua
-- table to a reply at a cost that counts on a path this short):
--   n                      claimed (an integer of at least 1): the caller
--                          owns attempt n, with the whole lease.
--   {"c", n, leaseLeftMs}  claimed before: a repeat with the same token
--                          (go-redis re-sends a script whose reply was
--                          lost) answers with the lease left.
--   {"t"}                  no record, but a tombstone with the caller's
--                          fingerprint: a late retry (with another, 0),
--                          counted in <stem>:late (lua/tombstone.lua)
--   record                 a finished record ("d" done, "f" failed), whole, as
--                          a string: the caller reads it, checks the
--                          fingerprint and cuts the outcome out. Nothing
--                          changes then, so the check need not be atomic,
--                          and Lua neither parses nor copies the record.
--                          With ARGV[3] = "1": {record, pttlMs}.
--   {"b", leaseLeftMs, n, owner}
--                          busy: another caller, whose token is owner,
--                          holds a live lease on attempt n. A waiter trusts
--                          an outcome that a notification carries only
--                          when it is that owner's (see complete.lua).
--   0                      conflict: the stored fingerprint differs.
--   {"v", reason}          the record is not one this version understands.
--   {"k", n, step}         parked (lua/record.lua, PARKED): the record is
--                          released or its lease ended, and its operation
--                          is parked at the checked step called step ("":
--                          after WithMaxRecoveries recoveries); no one takes
--                          it over until an operator resolves it (Retry).
--   {"g"}                  a recovery only: nothing to recover (no record,
--                          or no stored input); its index entry is removed.
--
-- No record is written unless the caller claims, and then in one SET (a
-- late retry only counts itself, beside the tombstones). A new key costs
-- one GET and that SET; a replay one GET. These usual answers come before
-- the helpers of lua/record.lua, which are inserted below: defining them
-- (Lua closures) costs every call that reaches them.
local s = redis.pcall('GET', KEYS[1])
local inKey = ARGV[6] and KEYS[#KEYS - 1]
if not s then
  if ARGV[9] and ARGV[9] ~= '' then
    redis.call('ZREM', KEYS[#KEYS], ARGV[7])
    return {'g'}
  end
  if KEYS[3] and KEYS[3] ~= inKey then
    --[[lua/tombstone.lua]]
    local v = tombLookup(KEYS[3], ARGV[4])
    if v then
      if ARGV[5] ~= '' and v ~= '' and v ~= ARGV[5] then
        return 0
      end
      -- Count it, by day, beside the buckets (see lua/tombstone.lua).
      local late, day = KEYS[3] .. ':late', math.floor(tombNow() / 86400000)
      redis.call('HINCRBY', late, day, 1)
      redis.call('PEXPIREAT', late, (day + TOMB_LATE_DAYS) * 86400000)
      if redis.call('HLEN', late) > TOMB_LATE_DAYS then
        for _, d in ipairs(redis.call('HKEYS', late)) do
          if (tonumber(d) or 0) <= day - TOMB_LATE_DAYS then
            redis.call('HDEL', late, d)
          end
        end
      end
      return {'t'}
    end
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if inKey then
    redis.call('SET', inKey, ARGV[6], 'PX', ARGV[2])
    -- Indexed (lua/record.lua, pendingAdd; its helpers are not defined
    -- on this path).
    local t = redis.call('TIME')
    redis.call('ZADD', KEYS[#KEYS], t[1] * 1000 + math.floor(t[2] / 1000) + ARGV[8], ARGV[7])
    if redis.call('PTTL', KEYS[#KEYS]) < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', KEYS[#KEYS], ARGV[2])
    end
  end
  return 1
end
local st = type(s) == 'string' and string.sub(s, 2, 2)
if st == 'd' or st == 'f' then
  if ARGV[9] and ARGV[9] ~= '' then
    redis.call('ZREM', KEYS[#KEYS], ARGV[7]) -- finished by a plain Do
  end
  if ARGV[3] == '1' then
    return {s, redis.call('PTTL', KEYS[1])}
  end
  return s
end

--[[lua/record.lua]]

if type(s) ~= 'string' then
  return {'v', notRecord(KEYS[1])}
end
-- The caller's fingerprint, token and lease mark, from its new claim.
local cst, cfp, token, _, _, cmark = parse(ARGV[1])
if cst ~= 'p' then
  return redis.error_reply('idem: claim: malformed claim record')
end
local fp, own, n, i, lu
st, fp, own, n, i, lu = parse(s)
if not st then
  return {'v', fp}
end
if cfp ~= '' and fp ~= '' and fp ~= cfp then
  return 0
end
if st == 'p' then
  local left = redis.call('PTTL', KEYS[1]) - lu
  if own == token then
    return {'c', n, math.max(left, 0)}
  end
  if left > 0 then
    if ARGV[9] and ARGV[9] ~= '' then
      -- A live owner that does not keep the index (a plain Do took it
      -- over): due again when its lease has passed.
      pendingAdd(KEYS[#KEYS], ARGV[7], left + ARGV[8] - (ARGV[2] - cmark), ARGV[2])
    end
    return {'b', left, n, own}
  end
end

-- A parked operation is taken over by no one (the marker is only looked
-- for here, on a takeover: a new key and a replay pay nothing for it).
if KEYS[2] then
  local pk = redis.call('HGET', KEYS[2], PARKED)
  if pk then
    if inKey then
      pendingPark(KEYS[#KEYS], ARGV[7], ARGV[2])
    end
    return {'k', n, string.sub(pk, 2)}
  end
end
if ARGV[9] and ARGV[9] ~= '' then
  -- A recovery: counted in the input's header, or the operation parked
  -- when WithMaxRecoveries recoveries did not finish it.
  local r, at = recoveries(inKey)
  if not r then
    redis.call('ZREM', KEYS[#KEYS], ARGV[7])
    return {'g'}
  end
  if r >= tonumber(ARGV[9]) then
    -- Parking ends the lease of an owner whose lease ran out but that
    -- may still be alive (model/idem.pml, mutant MR4): released, its
    -- renewals and its outcome are refused, and it runs no parked
    -- operation.
    if st == 'p' then
      redis.call('SET', KEYS[1], '1r' .. string.sub(s, 3), 'KEEPTTL')
    end
    park(KEYS[1], KEYS[2], KEYS[#KEYS], ARGV[7], ARGV[2])
    return {'k', n, ''}
  end
  redis.call('SETRANGE', inKey, at, string.char(r + 1))
end

-- Released, or a lease that ended without completion: take over with the
-- next attempt number, the fencing token. Numbers are written with %d:
-- Lua's own conversion switches to an exponent from 10^14 on, which no
-- record may hold.
n = n + 1
if fp == '' then fp = cfp end
redis.call('SET', KEYS[1], '1p' .. string.char(#fp) .. fp ..
  string.char(#token) .. token .. string.format('%d', n) .. ':' ..
  string.format('%d', cmark), 'PX', ARGV[2])
if KEYS[2] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
if inKey then
  if ARGV[6] ~= '' then
    redis.call('SET', inKey, ARGV[6], 'PX', ARGV[2])
  else
    redis.call('PEXPIRE', inKey, ARGV[2])
  end
  pendingAdd(KEYS[#KEYS], ARGV[7], ARGV[8], ARGV[2])
end
return n
