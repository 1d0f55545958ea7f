-- claim.lua: claim an idempotency key for one caller, or report its state.
-- (lua/record.lua, prepended, describes the record and its helpers.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- ARGV[1]  fingerprint digest of the parameters ("" = not checked)
-- ARGV[2]  owner token, random per Do call
-- ARGV[3]  lease in milliseconds
-- ARGV[4]  retention in milliseconds (the record's TTL)
--
-- Returns one of:
--   {"c", n, leaseLeftMs}  claimed: the caller owns attempt n. A repeat with
--                          the same token (go-redis re-sends a script whose
--                          reply was lost) answers the same.
--   {"d", record, i}       done: the stored result is record's bytes after
--                          position i (1-based): the caller cuts it out, so
--                          a large result is not copied in Lua.
--   {"f", record, i}       failed: likewise the stored permanent error.
--   {"b", leaseLeftMs, n}  busy: another caller holds a live lease on attempt n.
--   {"x"}                  conflict: the stored fingerprint differs.
--   {"v", reason}          the record is not one this version understands.
--
-- Time is the server's (TIME), never the client's. Nothing is written
-- unless the caller claims, and then in one HSET plus one PEXPIRE.
local t = kind(KEYS[1])
if t == 'string' then
  local s = redis.call('GET', KEYS[1])
  local st, fp, _, _, i = finished(s)
  if not st then
    return {'v', fp}
  end
  if ARGV[1] ~= '' and fp ~= '' and fp ~= ARGV[1] then
    return {'x'}
  end
  return {st, s, i}
end

local now = serverMs()
local lease = tonumber(ARGV[3])
if t == 'none' then
  redis.call('HSET', KEYS[1], 'v', '1', 'st', 'p', 'fp', ARGV[1],
    'own', ARGV[2], 'n', '1', 'lu', tostring(now + lease))
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {'c', 1, lease}
end
if t ~= 'hash' then
  return {'v', 'record is a ' .. t}
end

local r = redis.call('HMGET', KEYS[1], 'v', 'st', 'fp', 'own', 'n', 'lu')
local v, st, fp, own, n, lu = r[1], r[2], r[3], r[4], count(r[5]), count(r[6])
if v ~= '1' then
  return {'v', 'unknown record version ' .. tostring(v)}
end
-- fp is at most 255 bytes: the finished form gives it one length byte.
if not n or n < 1 or not lu or not fp or #fp > 255 or (st ~= 'p' and st ~= 'r') then
  return {'v', 'malformed record'}
end
if ARGV[1] ~= '' and fp ~= '' and fp ~= ARGV[1] then
  return {'x'}
end
if st == 'p' then
  if own == ARGV[2] then
    return {'c', n, math.max(lu - now, 0)}
  end
  if lu > now then
    return {'b', lu - now, n}
  end
end

-- Released, or a lease that ended without completion: take over with the
-- next attempt number, the fencing token.
n = n + 1
if fp == '' then fp = ARGV[1] end
redis.call('HSET', KEYS[1], 'st', 'p', 'fp', fp, 'own', ARGV[2],
  'n', tostring(n), 'lu', tostring(now + lease))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {'c', n, lease}
