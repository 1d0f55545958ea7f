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
-- Buckets are named <base>:<e>:<k>.<j>, where base is <prefix>:t:{<tag>}
-- with a tag in the record's cluster slot (the caller passes it in KEYS),
-- e is the end of the bucket's time window in milliseconds since 1970 (the
-- bucket expires then), and k.j a level and an index in it. A completion
-- puts its tombstone in the window of its Client's width (a quarter of its
-- span, retention + tombstone time) that holds the tombstone's expiry, so a
-- tombstone lasts at least as long as asked and at most a window longer.
-- Level 0 has one bucket per window; a bucket holds at most 128 fields,
-- which keeps it in Redis's compact listpack encoding (about 20 bytes a
-- tombstone); when it is full, writers go on to level k+1, whose bucket j
-- is chosen by the field's first k+1 bits. Fields are never removed before
-- their bucket expires (forgetting marks them), so a bucket that is not
-- full never was: a reader stops there.
--
-- Clients of other spans (a deploy that changes WithRetention or
-- WithTombstones; two versions during a rolling deploy) use windows of
-- other widths. So that each finds the others' tombstones, the widths in
-- use are registered beside the buckets, in the hash <base>:w: its fields
-- are widths in milliseconds, its values the end of the last window of
-- that width that holds a bucket. A reader (claim.lua, forget.lua) reads
-- it, and looks in every live window of every width: the windows are
-- known, not guessed from the reader's own span. A writer updates it only
-- when its window ends later than the registered one: once a window, per
-- slot. The registry drops widths whose windows have all ended, and
-- expires with its last window.
--
-- Late retries are counted beside the buckets, in the hash <base>:late (in
-- the same slot): its fields are days since 1970 (UTC), its values the late
-- retries claim.lua answered that day. It holds the last TOMB_LATE_DAYS
-- days (older fields are dropped when a newer one is added), and expires
-- that long after its last late retry; idemctl stats sums these hashes.

local TOMB_FULL = 128
local TOMB_LATE_DAYS = 8

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

-- tombFind returns the bucket of the window that ends at e under base that
-- holds field f, and f's value there; nil when none does.
local function tombFind(base, e, f)
  local j = 0
  for k = 0, 47 do
    local b = base .. ':' .. string.format('%d', e) .. ':' .. k .. '.' .. j
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

-- tombEach calls visit(e) with the end e of every window under base that
-- may hold a live tombstone now, of every registered width, until visit
-- returns a value; tombEach returns that value, or nil.
local function tombEach(base, visit)
  local now = tombNow()
  local reg = redis.call('HGETALL', base .. ':w')
  for n = 1, #reg, 2 do
    local w, last = tonumber(reg[n]), tonumber(reg[n + 1])
    if w and last and w > 0 then
      -- The first window that has not ended, up to the last registered.
      for e = (math.floor(now / w) + 1) * w, last, w do
        local r = visit(e)
        if r ~= nil then
          return r
        end
      end
    end
  end
  return nil
end

-- tombLookup returns the value of field f's live tombstone, or nil.
local function tombLookup(base, f)
  return tombEach(base, function(e)
    local _, v = tombFind(base, e, f)
    if v and v ~= 'x' then
      return v
    end
  end)
end

-- tombForget marks every tombstone of field f forgotten.
local function tombForget(base, f)
  tombEach(base, function(e)
    local b = tombFind(base, e, f)
    if b then
      redis.call('HSET', b, f, 'x')
    end
  end)
end

-- tombWrite leaves field f's tombstone, with value v, for span from now, in
-- a window of width window (milliseconds), and registers the window.
local function tombWrite(base, f, v, span, window)
  local now = tombNow()
  local e = (math.floor((now + span) / window) + 1) * window
  local j = 0
  for k = 0, 47 do
    local b = base .. ':' .. string.format('%d', e) .. ':' .. k .. '.' .. j
    if redis.call('HLEN', b) < TOMB_FULL or redis.call('HEXISTS', b, f) == 1 then
      redis.call('HSET', b, f, v)
      redis.call('PEXPIREAT', b, e)
      break
    end
    j = j * 2 + tombBit(f, k)
  end
  local reg, w = base .. ':w', string.format('%d', window)
  if (tonumber(redis.call('HGET', reg, w)) or 0) >= e then
    return
  end
  redis.call('HSET', reg, w, string.format('%d', e))
  local all, last = redis.call('HGETALL', reg), e
  for n = 1, #all, 2 do
    local x = tonumber(all[n + 1]) or 0
    if x <= now then
      redis.call('HDEL', reg, all[n])
    elseif x > last then
      last = x
    end
  end
  redis.call('PEXPIREAT', reg, last)
end
