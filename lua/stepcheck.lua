-- stepcheck.lua: the intent, checkpoint and parked marker of one checked
-- step (idem.StepChecked), and an operator's resolution of a parked one.
-- Every operation but "resolve" is a compare-and-set on the owner token, as
-- in step.lua; the checkpoints share step.lua's hash and its bounds.
-- (lua/record.lua, prepended, describes the record and its helpers.)
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- KEYS[2]  its checkpoints, the hash <prefix>:{<key>}:steps (same slot;
--          see step.lua). Besides step.lua's values ("d" result, "f"
--          failure), a checked step's field may hold
--            "i" ms ":" own  an intent: the step's act may have acted;
--                            ms is the server's clock (TIME) when it was
--                            stored, own the token of the attempt that
--                            stored it
--            "u" ms ":" own  parked: its outcome could not be settled;
--                            nothing runs the step until "resolve"
--          and field PARKED (lua/record.lua) marks the whole operation
--          parked while one of its steps is. Intents and parked markers do not count in field "" (the bytes
--          used): they are small and replaced by a checkpoint or deleted.
-- ARGV[1]  the caller's owner token ("" for "resolve")
-- ARGV[2]  the step's name
-- ARGV[3]  the operation, below; ARGV[4], ARGV[5] its arguments
--
-- Unless the operation is "resolve", nothing is read or written and the
-- reply is 0 when KEYS[1] holds no record in progress ("p") owned by
-- ARGV[1]; otherwise the hash's TTL becomes the record's, as in step.lua.
--
-- "begin": before act runs. Field absent, or an intent of ARGV[1] (a
--   re-sent begin): stores an intent of ARGV[1] and returns "". Otherwise
--   returns the stored value, an intent's with its age instead of its
--   time: "i" age_ms, "u" age_ms, or the checkpoint ("d"..., "f"...).
-- "rearm" ARGV[4]=settle_ms: check said not applied. An intent of another
--   owner (an earlier attempt, whose act may have sent until its lease
--   ended) becomes an intent of ARGV[1] dated now, and the reply is {2,
--   settle_ms}. When the field is an intent of ARGV[1] at least settle_ms
--   old, it becomes a new intent of ARGV[1] (act may run again) and the
--   reply is {1, 0}; a younger one is left and the reply is {2, ms still
--   to wait}; no intent: {3, 0}. A re-sent begin of the same owner dates
--   its intent anew: StepChecked sends one when act returns Ambiguous, as
--   act may have sent its request at any moment before it returned.
-- "clear": act failed without acting: an intent is deleted; returns 1, or
--   3 when the field holds something else (kept).
-- "park": an intent becomes a parked marker (its time kept); returns 1
--   (also when it is parked already), or 3 when the field holds a
--   checkpoint or nothing.
-- "store" ARGV[4]=checkpoint ARGV[5]=limit: as step.lua's write (1 stored
--   or these bytes stored already, 2 over ARGV[5], 3 another checkpoint or
--   a parked marker is stored), except that an intent is replaced.
-- "resolve" ARGV[4]=checkpoint or "" ARGV[5]=limit: an operator settles a
--   parked step, with no owner token: returns 1 when the parked marker was
--   replaced by the checkpoint (or deleted, for ""), 0 when there is no
--   record, 4 when the record is finished ("d", "f"), 2 over ARGV[5], and
--   3 when the step is not parked (nothing changes). A parked marker is
--   written only by its owner, whose attempt then ends, so no fence on a
--   token is needed: the marker itself is the fence.
if ARGV[2] == '' then
  return redis.error_reply('idem: step: empty name')
end
local s = get(KEYS[1])
if not s then
  return 0
end
local st, _, own = parse(s)
local op = ARGV[3]
if op == 'resolve' then
  if not st then
    return 0
  end
  if st == 'd' or st == 'f' then
    return 4
  end
elseif st ~= 'p' or own ~= ARGV[1] then
  return 0
end

local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function keep()
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[2], ttl)
  else
    redis.call('PERSIST', KEYS[2])
  end
end
-- marker splits an intent or parked marker into its tag, time and owner.
local function marker(v)
  local tag, ms, by = string.match(v, '^([iu])(%d+):(.*)$')
  return tag, tonumber(ms), by
end
-- put stores checkpoint cp in place of old (nil, an intent), bounded as
-- step.lua bounds it.
local function put(old, cp, limit)
  if old then
    if old == cp then
      return 1
    end
    local tag = marker(old)
    if tag ~= 'i' then
      return 3
    end
  end
  local size = (count(redis.call('HGET', KEYS[2], '') or '0') or 0) + #ARGV[2] + #cp
  local l = count(limit)
  if not l then
    return redis.error_reply('idem: step: malformed limit')
  end
  if l > 0 and size > l then
    return 2
  end
  redis.call('HSET', KEYS[2], ARGV[2], cp, '', string.format('%d', size))
  return 1
end

local old = redis.call('HGET', KEYS[2], ARGV[2])
if op == 'resolve' then
  if not old or marker(old) ~= 'u' then
    return 3
  end
  -- The operation's parked marker (lua/record.lua, PARKED) goes with it.
  local pk = redis.call('HGET', KEYS[2], PARKED)
  if ARGV[4] == '' then
    redis.call('HDEL', KEYS[2], ARGV[2], PARKED)
    return 1
  end
  redis.call('HDEL', KEYS[2], ARGV[2], PARKED) -- put replaces intents only
  local r = put(nil, ARGV[4], ARGV[5])
  if r ~= 1 then
    if pk then
      redis.call('HSET', KEYS[2], ARGV[2], old, PARKED, pk)
    else
      redis.call('HSET', KEYS[2], ARGV[2], old)
    end
  end
  return r
end

local r
if op == 'begin' then
  local tag, ms, by = nil, nil, nil
  if old then
    tag, ms, by = marker(old)
  end
  if not old or (tag == 'i' and by == ARGV[1]) then
    redis.call('HSET', KEYS[2], ARGV[2], 'i' .. string.format('%d', now()) .. ':' .. ARGV[1])
    r = ''
  elseif tag then
    r = tag .. string.format('%d', math.max(0, now() - ms))
  else
    r = old
  end
elseif op == 'rearm' then
  local tag, ms, by = nil, nil, nil
  if old then
    tag, ms, by = marker(old)
  end
  local settle = count(ARGV[4])
  if not settle then
    return redis.error_reply('idem: step: malformed settle time')
  end
  local t = now()
  if tag ~= 'i' then
    r = {3, 0}
  elseif by ~= ARGV[1] then
    -- An earlier attempt's intent: its act may have sent until that
    -- attempt's lease ended, after the intent's time but before this
    -- attempt's claim. The settle time counts from now.
    redis.call('HSET', KEYS[2], ARGV[2], 'i' .. string.format('%d', t) .. ':' .. ARGV[1])
    r = {2, math.max(settle, 1)}
  elseif t - ms >= settle then
    redis.call('HSET', KEYS[2], ARGV[2], 'i' .. string.format('%d', t) .. ':' .. ARGV[1])
    r = {1, 0}
  else
    r = {2, settle - (t - ms)}
  end
elseif op == 'clear' then
  r = 3
  if not old then
    r = 1
  elseif marker(old) == 'i' then
    redis.call('HDEL', KEYS[2], ARGV[2])
    r = 1
  end
elseif op == 'park' then
  r = 3
  if old then
    local tag = marker(old)
    if tag == 'i' then
      -- The marker, and the operation's parked marker (lua/record.lua,
      -- PARKED): no claim takes the operation over until it is resolved.
      redis.call('HSET', KEYS[2], ARGV[2], 'u' .. string.sub(old, 2), PARKED, 'k' .. ARGV[2])
      r = 1
    elseif tag == 'u' then
      r = 1
    end
  end
elseif op == 'store' then
  r = put(old, ARGV[4], ARGV[5])
else
  return redis.error_reply('idem: step: unknown operation')
end
keep()
return r
