-- status.lua: read a record for Status, with the server's clock.
--
-- KEYS[1]  the record hash, <prefix>:{<key>}
--
-- Returns {nowMs, pttlMs, v, st, n, lu}; v, st, n and lu are false when the
-- record or the field is absent. pttlMs is PTTL's answer (-2 absent, -1 none).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local r = redis.call('HMGET', KEYS[1], 'v', 'st', 'n', 'lu')
return {now, redis.call('PTTL', KEYS[1]), r[1], r[2], r[3], r[4]}
