-- record.lua: shared by the scripts; it is prepended to each of them.
--
-- A record has two forms, both at KEYS[1] = <prefix>:{<key>}:
--
-- * while an attempt is in progress or released: a hash with the fields
--   v (format version "1"), st ("p" in progress, "r" released), fp
--   (fingerprint digest), own (owner token), n (attempt number), lu (lease
--   end, server time in ms);
-- * once finished: a string, so that a stored result costs its own bytes
--   plus little more (a hash holding a value over 64 bytes would switch to
--   Redis's large hashtable encoding):
--     "1" st len(fp) fp len(own) own n ":" payload
--   where st is "d" (payload is the result) or "f" (payload is the
--   permanent error's message), and each len is one byte.

-- count parses a decimal count of at most 15 digits ("1", "42"), exactly
-- as written: tonumber alone would take "0x10", " 2", "1e3" and "1.5".
local function count(s)
  if type(s) ~= 'string' or not string.match(s, '^%d+$') or #s > 15 then
    return nil
  end
  return tonumber(s)
end

-- finished parses a finished record. It returns st, fp, own, n and the
-- position of the ":" before the payload (the payload itself is not copied:
-- it may be large), or nil and the reason when s is not a record this
-- version understands.
local function finished(s)
  if string.sub(s, 1, 1) ~= '1' then
    return nil, 'unknown record version'
  end
  local st = string.sub(s, 2, 2)
  local fl = string.byte(s, 3)
  if (st ~= 'd' and st ~= 'f') or not fl then
    return nil, 'malformed record'
  end
  local p = 4 + fl
  local ol = string.byte(s, p)
  if not ol then
    return nil, 'malformed record'
  end
  local c = string.find(s, ':', p + 1 + ol, true)
  local n = c and count(string.sub(s, p + 1 + ol, c - 1))
  if not n or n < 1 then
    return nil, 'malformed record'
  end
  return st, string.sub(s, 4, 3 + fl), string.sub(s, p + 1, p + ol), n, c
end

-- kind returns the Redis type of the record: "none", "hash", "string", ...
local function kind(key)
  local t = redis.call('TYPE', key)
  return t['ok'] or t
end

-- serverMs is the server's clock in milliseconds.
local function serverMs()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
