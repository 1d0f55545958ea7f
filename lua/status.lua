-- status.lua: read a record for Status, with the server's clock.
-- (lua/record.lua, prepended, describes the record and its helpers.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
--
-- Returns {nowMs, pttlMs, st, n, lu} where pttlMs is PTTL's answer (-2
-- absent, -1 no TTL), st is "" when the record is absent, and n and lu are
-- 0 when unknown (lu is 0 for finished records); or {"v", reason} when the
-- record is not one this version understands.
local now = serverMs()
local pttl = redis.call('PTTL', KEYS[1])
local t = kind(KEYS[1])
if t == 'none' then
  return {now, pttl, '', 0, 0}
end
if t == 'string' then
  local st, why, _, n = finished(redis.call('GET', KEYS[1]))
  if not st then
    return {'v', why}
  end
  return {now, pttl, st, n, 0}
end
if t ~= 'hash' then
  return {'v', 'record is a ' .. t}
end
local r = redis.call('HMGET', KEYS[1], 'v', 'st', 'n', 'lu', 'fp')
local n, lu = count(r[3]), count(r[4])
if r[1] ~= '1' then
  return {'v', 'unknown record version ' .. tostring(r[1])}
end
if (r[2] ~= 'p' and r[2] ~= 'r') or not n or n < 1 or not lu or not r[5] or #r[5] > 255 then
  return {'v', 'malformed record'}
end
return {now, pttl, r[2], n, lu}
