-- claim.lua: claim an idempotency key for one caller, or report its state.
-- (lua/record.lua, prepended, describes the record and its helpers.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- ARGV[1]  fingerprint digest of the parameters ("" = not checked)
-- ARGV[2]  owner token, random per Do call
-- ARGV[3]  lease in milliseconds
-- ARGV[4]  retention in milliseconds (the record's TTL), at least the lease
--
-- Returns one of:
--   {"c", n, leaseLeftMs}  claimed: the caller owns attempt n. A repeat with
--                          the same token (go-redis re-sends a script whose
--                          reply was lost) answers the same.
--   record                 a finished record ("d" done, "f" failed), whole, as
--                          a string: the caller reads it, checks the
--                          fingerprint and cuts the outcome out. Nothing
--                          changes then, so the check need not be atomic,
--                          and Lua neither parses nor copies the record.
--   {"b", leaseLeftMs, n}  busy: another caller holds a live lease on attempt n.
--   {"x"}                  conflict: the stored fingerprint differs.
--   {"v", reason}          the record is not one this version understands.
--
-- Nothing is written unless the caller claims, and then in one SET. A new
-- key costs one GET and that SET; a replay one GET.
local s, why = get(KEYS[1])
if s == nil then
  return {'v', why}
end
local lease = tonumber(ARGV[3])
-- Numbers are written with %d: Lua's own conversion switches to an
-- exponent from 10^14 on, which no record may hold.
local mark = string.format('%d', tonumber(ARGV[4]) - lease)
if not s then
  redis.call('SET', KEYS[1], '1p' .. string.char(#ARGV[1]) .. ARGV[1] ..
    string.char(#ARGV[2]) .. ARGV[2] .. '1:' .. mark, 'PX', ARGV[4])
  return {'c', 1, lease}
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
  return {'x'}
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
-- next attempt number, the fencing token.
n = n + 1
if fp == '' then fp = ARGV[1] end
redis.call('SET', KEYS[1], '1p' .. string.char(#fp) .. fp ..
  string.char(#ARGV[2]) .. ARGV[2] .. string.format('%d', n) .. ':' .. mark, 'PX', ARGV[4])
return {'c', n, lease}
