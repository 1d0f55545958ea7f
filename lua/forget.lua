-- forget.lua: delete a record, its steps' checkpoints, its stored input, its
-- index entry, and its tombstone (WithTombstones).
-- Model: Forget in model/idem.pml.
--
-- KEYS[1]  the record, <prefix>:{<key>}
-- KEYS[2]  its steps' checkpoints, <prefix>:{<key>}:steps (see
--          lua/step.lua), deleted with it in one command
-- KEYS[3]  the stem of its tombstone buckets (see lua/tombstone.lua),
--          passed whether or not the caller leaves tombstones
-- KEYS[4]  its stored input (Op.Do), <prefix>:{<key>}:in
-- KEYS[5]  its bucket of the index of unfinished operations (lua/record.lua)
-- ARGV[1]  the tombstone's field
-- ARGV[2]  its member in that bucket (the key)
--
-- Returns 1. Every tombstone of the key is marked forgotten ("x"), not
-- removed (buckets only fill up until they expire), in the windows of every
-- span that left tombstones, whatever the caller's (see lua/tombstone.lua).
redis.call('DEL', KEYS[1], KEYS[2], KEYS[4])
if KEYS[5] then
  redis.call('ZREM', KEYS[5], ARGV[2])
end
if KEYS[3] then
  --[[lua/tombstone.lua]]
  tombForget(KEYS[3], ARGV[1])
end
return 1
