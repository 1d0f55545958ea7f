-- tombstone.lua: the tombstones of finished records (WithTombstones),
-- shared by claim.lua, complete.lua and forget.lua; inserted where they say
-- --[[lua/tombstone.lua]], on the paths that use it only.
-- Model: the tombstone (rtomb) in model/idem.pml.
--
-- A tombstone is what is left of a finished record once its retention has
-- ended: a field of a hash, the bucket, whose name is the first 8 bytes of
-- the SHA-256 of the record's key (the caller computes it) and whose value
-- is the first 8 bytes of the record's fingerprint digest ("" when it had
-- none; "x" once forgotten). A claim that finds no record but a tombstone
-- never claims: the key was used, and its outcome is gone.
--
-- Buckets are named <base>:<i>:<k>.<j>, where base is <prefix>:t:{<tag>}
-- with a tag in the record's cluster slot (the caller passes it in KEYS),
-- i is a time window, the tombstone's expiry divided by the window width
-- (the bucket expires at the end of window i, so a tombstone lasts at
-- least as long as asked and at most a window longer), and k.j a level and
-- an index in it. Level 0 has one bucket per window; a bucket holds at most
-- 128 fields, which keeps it in Redis's compact listpack encoding (about 20
-- bytes a tombstone); when it is full, writers go on to level k+1, whose
-- bucket j is chosen by the field's first k+1 bits. Fields are never
-- removed before their bucket expires (forgetting marks them), so a bucket
-- that is not full never was: a reader stops there.

local TOMB_FULL = 128

-- tombNow returns the server's time in milliseconds.
local function tombNow()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- tombBit returns bit k (0 = the first byte's highest) of field f.
local function tombBit(f, k)
  local b = string.byte(f, math.floor(k / 8) + 1) or 0
  return math.floor(b / 2 ^ (7 - k % 8)) % 2
end

-- tombFind returns the bucket of window i under base that holds field f,
-- and f's value there; nil when none does.
local function tombFind(base, i, f)
  local j = 0
  for k = 0, 47 do
    local b = base .. ':' .. i .. ':' .. k .. '.' .. j
    local v = redis.call('HGET', b, f)
    if v then
      return b, v
    end
    if redis.call('HLEN', b) < TOMB_FULL then
      return nil
    end
    j = j * 2 + tombBit(f, k)
  end
  return nil
end

-- tombWindows returns the first and the last window that may hold a live
-- tombstone now: the windows that have not ended, up to that of a
-- completion made now.
local function tombWindows(span, window)
  local now = tombNow()
  return math.floor(now / window), math.floor((now + span) / window)
end

-- tombLookup returns the value of field f's live tombstone, or nil.
local function tombLookup(base, f, span, window)
  local first, last = tombWindows(span, window)
  for i = first, last do
    local _, v = tombFind(base, i, f)
    if v and v ~= 'x' then
      return v
    end
  end
  return nil
end

-- tombWrite leaves field f's tombstone, with value v, for span from now.
local function tombWrite(base, f, v, span, window)
  local i = math.floor((tombNow() + span) / window)
  local j = 0
  for k = 0, 47 do
    local b = base .. ':' .. i .. ':' .. k .. '.' .. j
    if redis.call('HLEN', b) < TOMB_FULL or redis.call('HEXISTS', b, f) == 1 then
      redis.call('HSET', b, f, v)
      redis.call('PEXPIREAT', b, (i + 1) * window)
      return
    end
    j = j * 2 + tombBit(f, k)
  end
end
