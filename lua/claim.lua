-- claim.lua: claim an idempotency key for one caller, or report its state.
-- (lua/record.lua, prepended, describes the record and its helpers.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- ARGV[1]  fingerprint digest of the parameters ("" = not checked)
-- ARGV[2]  owner token, random per Do call
-- ARGV[3]  lease in milliseconds
-- ARGV[4]  retention in milliseconds (the record's TTL), at least the lease
-- ARGV[5]  the record of a new claim, built by the caller: attempt 1 in
--          progress, fingerprint ARGV[1], owner ARGV[2], lease mark
--          retention - lease (lua/record.lua)
--
-- Returns one of (the usual answers are scalars: Redis converts a Lua
-- table to a reply at a cost that counts on a path this short):
--   n                      claimed (an integer of at least 1): the caller
--                          owns attempt n, with the whole lease.
--   {"c", n, leaseLeftMs}  claimed before: a repeat with the same token
--                          (go-redis re-sends a script whose reply was
--                          lost) answers with the lease left.
--   record                 a finished record ("d" done, "f" failed), whole, as
--                          a string: the caller reads it, checks the
--                          fingerprint and cuts the outcome out. Nothing
--                          changes then, so the check need not be atomic,
--                          and Lua neither parses nor copies the record.
--   {"b", leaseLeftMs, n}  busy: another caller holds a live lease on attempt n.
--   0                      conflict: the stored fingerprint differs.
--   {"v", reason}          the record is not one this version understands.
--
-- Nothing is written unless the caller claims, and then in one SET. A new
-- key costs one GET and that SET; a replay one GET.
local s, why = get(KEYS[1])
if s == nil then
  return {'v', why}
end
if not s then
  redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[4])
  return 1
end

local st = string.sub(s, 2, 2)
if st == 'd' or st == 'f' then
  return s
end
local fp, own, n, i, lu
st, fp, own, n, i, lu = parse(s)
if not st then
  return {'v', fp}
end
if ARGV[1] ~= '' and fp ~= '' and fp ~= ARGV[1] then
  return 0
end
if st == 'p' then
  local left = redis.call('PTTL', KEYS[1]) - lu
  if own == ARGV[2] then
    return {'c', n, math.max(left, 0)}
  end
  if left > 0 then
    return {'b', left, n}
  end
end

-- Released, or a lease that ended without completion: take over with the
-- next attempt number, the fencing token. Numbers are written with %d:
-- Lua's own conversion switches to an exponent from 10^14 on, which no
-- record may hold.
n = n + 1
if fp == '' then fp = ARGV[1] end
redis.call('SET', KEYS[1], '1p' .. string.char(#fp) .. fp ..
  string.char(#ARGV[2]) .. ARGV[2] .. string.format('%d', n) .. ':' ..
  string.format('%d', tonumber(ARGV[4]) - tonumber(ARGV[3])), 'PX', ARGV[4])
return n
