-- forget.lua: delete a record, its steps' checkpoints, and its tombstone
-- (WithTombstones).
-- Model: Forget in model/idem.pml.
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- KEYS[2]  its steps' checkpoints, <prefix>:{<key>}:steps (see
--          lua/step.lua), deleted with it in one command
-- KEYS[3]  (with tombstones) the stem of its tombstone buckets (see
--          lua/tombstone.lua)
-- ARGV[1]  (with tombstones) the tombstone's field
-- ARGV[2]  (with tombstones) the tombstones' span, retention + tombstone
--          time, in milliseconds
-- ARGV[3]  (with tombstones) the width of their windows, in milliseconds
--
-- Returns 1. The tombstone is marked forgotten ("x"), not removed: buckets
-- only fill up until they expire (see lua/tombstone.lua).
redis.call('DEL', KEYS[1], KEYS[2])
if KEYS[3] then
  --[[lua/tombstone.lua]]
  local first, last = tombWindows(tonumber(ARGV[2]), tonumber(ARGV[3]))
  for i = first, last do
    local b = tombFind(KEYS[3], i, ARGV[1])
    if b then
      redis.call('HSET', b, ARGV[1], 'x')
    end
  end
end
return 1
