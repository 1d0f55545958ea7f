-- record.lua: shared by the scripts; it is inserted into each of them where
-- it says --[[lua/record.lua]], or at the top.
-- Model: the record (rst, rown, rn, rlease, rttl) in model/idem.pml.
--
-- A record is one string at KEYS[1] = <prefix>:{<key>}, in every state:
--
--   "1" st len(fp) fp len(own) own n ":" tail
--
-- "1" is the format version; st the state: "p" in progress, "r" released,
-- "d" done, "f" failed; fp the fingerprint digest ("" = not checked); own
-- the token of the attempt's owner, random per Do call; n the attempt
-- number (decimal), the fencing token; each len is one byte. The tail is:
--
-- * for "d", the result; for "f", the permanent error's message (so a
--   stored result costs its own bytes plus little more);
-- * for "p" and "r", the lease mark: the record's TTL (PTTL, in ms) at
--   which the attempt's lease ends. The lease has PTTL - mark ms left: a
--   claim sets the TTL to the retention R and the mark to R - lease, and
--   the server counts the TTL down. So leases run on the server's clock,
--   and a claim needs no TIME call.
--
-- Every write replaces the whole string in one SET: Redis does not roll a
-- script back, so a script that wrote twice could leave half a change.

-- PARKED is the field of a record's checkpoints hash (<prefix>:{<key>}:steps)
-- that marks the operation parked: its value is "k" and the name of the
-- parked checked step. It is longer than any step's name (at most 256
-- bytes), so it is no step's field; the record's own format is unchanged,
-- so the previous release's scripts still read it. A claim that would take
-- a parked operation over answers parked instead (lua/claim.lua).
local PARKED = string.rep('!', 257)

-- The stored input of a registered operation (Op.Do), at
-- <prefix>:{<key>}:in, with the record's TTL, is one string:
--
--   "1" len(name) name r input
--
-- "1" the format version; name the operation's name (Register), its len
-- one byte; r one byte, the recoveries that took it over since a caller
-- last claimed it (WithMaxRecoveries); input the input, msgpack.
--
-- The index: an unfinished registered operation is a member of one bucket
-- of the index of unfinished operations, a sorted set at
-- <prefix>:{<tag>}:pending, whose tag puts it in the record's hash slot
-- (on Cluster, one bucket per slot; elsewhere 1024, by slot). Its member
-- is the key (not the record's Redis key), its score the server's time in
-- ms at which it is due for recovery: the lease's end (moved by every
-- renewal) plus WithRecoverAfter, or a release's time plus
-- WithRecoverAfter; PARKED_DUE when parked. The claim, renew, complete
-- and release scripts of registered operations keep it in their own round
-- trips (complete removes the member; Forget too); plain Do calls never
-- touch it. A bucket lives as long as its longest-lived record. Small
-- buckets stay listpacks: a member costs its key's bytes and a few more.
local PARKED_DUE = 2 ^ 52

-- serverNow returns the server's time in milliseconds.
local function serverNow()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- pendingKeep makes bucket idx live at least ret ms, as long as the
-- record just indexed in it.
local function pendingKeep(idx, ret)
  if redis.call('PTTL', idx) < tonumber(ret) then
    redis.call('PEXPIRE', idx, ret)
  end
end

-- pendingAdd indexes member in bucket idx as due in ms from now; the
-- bucket lives at least ret ms.
local function pendingAdd(idx, member, ms, ret)
  redis.call('ZADD', idx, serverNow() + ms, member)
  pendingKeep(idx, ret)
end

-- pendingPark keeps member in bucket idx, parked: never due.
local function pendingPark(idx, member, ret)
  redis.call('ZADD', idx, PARKED_DUE, member)
  pendingKeep(idx, ret)
end

-- recoveries returns the recoveries counted in the stored input at inKey,
-- and the offset of their byte; nil when there is no input.
local function recoveries(inKey)
  local h = redis.call('GETRANGE', inKey, 0, 257)
  if string.sub(h, 1, 1) ~= '1' or #h < 3 then
    return nil
  end
  local at = 2 + string.byte(h, 2)
  local r = string.byte(h, at + 1)
  if not r then
    return nil
  end
  return r, at
end

-- park parks the operation of record rec after its recoveries
-- (WithMaxRecoveries): the marker PARKED, with no step's name, in its
-- checkpoints at steps, living as long as the record.
local function park(rec, steps, idx, member, ret)
  redis.call('HSET', steps, PARKED, 'k')
  local ttl = redis.call('PTTL', rec)
  if ttl > 0 then
    redis.call('PEXPIRE', steps, ttl)
  end
  pendingPark(idx, member, ret)
end

-- count parses a decimal count of at most 15 digits ("1", "42"), exactly
-- as written: tonumber alone would take "0x10", " 2", "1e3" and "1.5".
local function count(s)
  if not string.match(s, '^%d+$') or #s > 15 then
    return nil
  end
  return tonumber(s)
end

-- notRecord says why the value at key, which GET refused, is no record.
local function notRecord(key)
  local t = redis.call('TYPE', key)
  return 'record is a ' .. (t['ok'] or tostring(t))
end

-- get returns the record at key: its string, false when there is none, or
-- nil and the reason when key holds something that is not a string.
local function get(key)
  local s = redis.pcall('GET', key)
  if type(s) == 'table' then
    return nil, notRecord(key)
  end
  return s
end

-- parse reads a record. It returns st, fp, own, n, the position of the
-- ":" before the tail (a payload is not copied: it may be large) and, for
-- "p" and "r", the lease mark; or nil and the reason when s is not a
-- record this version understands.
local function parse(s)
  if string.sub(s, 1, 1) ~= '1' then
    return nil, 'unknown record version'
  end
  local st = string.sub(s, 2, 2)
  local fl = string.byte(s, 3)
  if not fl or (st ~= 'p' and st ~= 'd' and st ~= 'r' and st ~= 'f') then
    return nil, 'malformed record'
  end
  local p = 4 + fl
  local ol = string.byte(s, p)
  if not ol or p + 1 + ol > #s then
    return nil, 'malformed record'
  end
  local c = string.find(s, ':', p + 1 + ol, true)
  local n = c and count(string.sub(s, p + 1 + ol, c - 1))
  if not n or n < 1 then
    return nil, 'malformed record'
  end
  local mark
  if st == 'p' or st == 'r' then
    mark = count(string.sub(s, c + 1))
    if not mark then
      return nil, 'malformed record'
    end
  end
  return st, string.sub(s, 4, 3 + fl), string.sub(s, p + 1, p + ol), n, c, mark
end
