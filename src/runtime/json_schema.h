// JsonSchema: a JSON Schema compiled into the graph that constrained decoding walks (json_schema_prefix.h).
// The server's response_format "json_schema" runs on it, and so does "json_object": an object of any keys
// and values is the schema {"type": "object"}.
//
// The subset is what structured-output schemas use (OpenAI's strict mode, pydantic's models): type (one
// or a list), properties / required / additionalProperties, items / minItems / maxItems, minLength /
// maxLength, enum / const, anyOf / oneOf, a one-element allOf, $ref into the schema itself ($defs,
// definitions, "#"), and annotations (title, description, default, examples, ...). Any other keyword is
// refused by name and path: following a schema in part would let the output break it.
//
// Every output the recognizer lets through is an instance of the schema; not every instance can be
// emitted, which keeps the recognizer a small deterministic machine:
// - an object's declared properties come in their declared order, and no undeclared ones (an object that
//   declares none takes any keys, with values of additionalProperties' schema);
// - an enum or const value is written as compact JSON;
// - an integer has no fraction or exponent;
// - anyOf branches must differ in the byte they begin with (a string and null, an object and an array), so
//   the first byte picks the branch; branches that overlap are refused.
// A schema comes with a request, so its size is bounded: 4096 nodes, subschemas nested 128 deep.
#pragma once

#include <bitset>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hlm {

class JsonSchema {
 public:
  // Containers an output may nest (a model looping on '[' would otherwise never close).
  static constexpr int kMaxDepth = 64;
  // A node's height when no finite instance of it exists.
  static constexpr int32_t kUnreachable = 1 << 20;
  static constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();

  enum class Kind : uint8_t { kObject, kArray, kString, kNumber, kLiterals, kAnyOf };

  struct Property {
    std::string key;  // as JSON text, quotes included: the bytes the output spells
    int32_t value = -1;
    bool required = false;
  };

  struct Node {
    Kind kind = Kind::kAnyOf;
    std::string path;  // where the schema wrote it, for errors
    // kObject. free_keys: any key, each value a `values` instance; else the declared properties in order.
    bool free_keys = false;
    int32_t values = -1;
    std::vector<Property> properties;
    std::vector<int32_t> key_order;       // property indices, their keys sorted bytewise
    std::vector<uint32_t> next_required;  // [i]: the first required index >= i (size(): none); size + 1
    // kArray.
    int32_t items = -1;
    uint32_t min_items = 0;
    uint32_t max_items = kUnbounded;
    // kString: characters (code points; an escape counts one).
    uint32_t min_length = 0;
    uint32_t max_length = kUnbounded;
    // kNumber.
    bool integer = false;
    // kLiterals: the allowed values as compact JSON, sorted bytewise, unique.
    std::vector<std::string> literals;
    // kAnyOf.
    std::vector<int32_t> branches;
    // The bytes an instance may begin with.
    std::bitset<256> first;
    // The fewest containers an instance nests (0 for a scalar); kUnreachable when none is finite.
    int32_t height = kUnreachable;
  };

  // `where` names the schema in errors ("response_format.json_schema.schema"); every refusal is an Error
  // naming the keyword and its path there. The schema is read in its key order (properties' order counts).
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::ordered_json& schema,
                                                   const std::string& where);
  // Any one JSON object: response_format "json_object".
  static std::shared_ptr<const JsonSchema> any_object();

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  static constexpr int32_t kRoot = 0;

 private:
  class Compiler;
  std::vector<Node> nodes_;
};

}  // namespace hlm
