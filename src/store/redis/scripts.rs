//! The Lua scripts that change a key atomically on the server, each after checking the
//! owner token, the tag or the value it replaces (see the module's doc in `mod.rs`).

/// Settles a claim if the value still opens with the caller's tag and token (ARGV[1]):
/// becomes ARGV[2] (`d` and the completion, or `h` and the hold) followed by the claim's
/// own fields, for ARGV[3] ms. With ARGV[4], publishes the key on that channel.
pub(super) const SETTLE: &str = r"
local value = redis.call('GET', KEYS[1])
if not value or string.sub(value, 1, #ARGV[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2] .. string.sub(value, #ARGV[1] + 1), 'PX', ARGV[3])
if ARGV[4] then
  redis.call('PUBLISH', ARGV[4], KEYS[1])
end
return 1
";

/// Deletes the key if its value opens with the caller's tag and token (ARGV[1]). With
/// ARGV[2], publishes the key on that channel.
pub(super) const RELEASE: &str = r"
if redis.call('GETRANGE', KEYS[1], 0, #ARGV[1] - 1) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] then
    redis.call('PUBLISH', ARGV[2], KEYS[1])
  end
  return 1
end
return 0
";

/// Renews a claim if the value still opens with the caller's tag and token (ARGV[1]):
/// its `lease_until` (the varint after `claimed_at`'s) becomes ARGV[2], and its time to
/// live ARGV[3] ms.
pub(super) const RENEW: &str = r"
local value = redis.call('GET', KEYS[1])
if not value or string.sub(value, 1, #ARGV[1]) ~= ARGV[1] then
  return 0
end
local function past_varint(at)
  while true do
    local byte = string.byte(value, at)
    if not byte then
      return nil
    end
    if byte < 128 then
      return at + 1
    end
    at = at + 1
  end
end
local lease_at = past_varint(#ARGV[1] + 1)
local after = lease_at and past_varint(lease_at)
if not after then
  return 0
end
redis.call('SET', KEYS[1], string.sub(value, 1, lease_at - 1) .. ARGV[2] .. string.sub(value, after), 'PX', ARGV[3])
return 1
";

/// Deletes a done key; reports an in-flight or held one, an absent one, or a value the
/// proxy did not write (left alone).
pub(super) const FORGET: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 'absent'
end
local tag = redis.call('GETRANGE', KEYS[1], 0, 0)
if tag == 'd' then
  redis.call('DEL', KEYS[1])
  return 'removed'
end
if tag == 'f' then
  return 'in_flight'
end
if tag == 'h' then
  return 'held'
end
return 'unknown'
";

/// Replaces the value if it is still ARGV[1]: by ARGV[2] for ARGV[3] ms, or deletes the
/// key when ARGV[2] is empty.
pub(super) const REPLACE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
";

/// Sets an entity's record to ARGV[2] for ARGV[3] ms unless the live one holds a sort key
/// as large as ARGV[1] (a value of another form counts as none). Returns 1 if set, else 0.
pub(super) const RECORD_VERSION: &str = r"
local current = redis.call('GET', KEYS[1])
local newest = current and string.match(current, '^v(%d+):')
if newest then
  local wanted = ARGV[1]
  local larger = false
  for i = 1, math.max(#wanted, #newest) do
    local a, b = string.byte(wanted, i) or -1, string.byte(newest, i) or -1
    if a ~= b then
      larger = a > b
      break
    end
  end
  if not larger then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
";
