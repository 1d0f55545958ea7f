-- status.lua: read a record for Status, with the server's clock.
-- Model: none: read-only, no caller acts on its answer (see "Status" in model/idem.pml).
-- (lua/record.lua, prepended, describes the record and its helpers.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- KEYS[2]  the stem of its tombstone buckets (see lua/tombstone.lua)
-- ARGV[1]  the tombstone's field
-- ARGV[2]  "1" to have a finished record itself returned too (Result)
--
-- Returns {nowMs, pttlMs, st, n, lu, tomb}, and the record as a seventh
-- element when ARGV[2] is "1" and the record is finished ("d" or "f"),
-- where nowMs is the server's clock (TIME), pttlMs is PTTL's answer (-2
-- absent, -1 no TTL), st is "" when the record is absent, n is 0 when
-- absent, lu is the lease end in server time for "p" and "r" records (0
-- otherwise), and tomb is 1 when the record is absent and a live
-- tombstone of the key is left, by a Client of any span, else 0; or
-- {"v", reason} when the record is not one this version understands.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s, why = get(KEYS[1])
if s == nil then
  return {'v', why}
end
local pttl = redis.call('PTTL', KEYS[1])
if not s then
  --[[lua/tombstone.lua]]
  local tomb = 0
  if tombLookup(KEYS[2], ARGV[1]) then
    tomb = 1
  end
  return {now, pttl, '', 0, 0, tomb}
end
local st, fp, _, n, _, mark = parse(s)
if not st then
  return {'v', fp}
end
local lu = 0
if mark then
  lu = math.max(now + pttl - mark, 0)
end
if ARGV[2] == '1' and (st == 'd' or st == 'f') then
  return {now, pttl, st, n, lu, 0, s}
end
return {now, pttl, st, n, lu, 0}
