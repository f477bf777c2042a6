// The compiler walks the schema once, depth first, making a node per subschema; $ref targets are compiled
// once and shared, which is what lets a recursive schema (a tree of nodes) be a finite graph. Two fixed
// points then give each node its first bytes and its height, the properties that depend on cycles.
#include "runtime/json_schema.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "base/error.h"

namespace hlm {

namespace {

using Json = nlohmann::ordered_json;

constexpr size_t kMaxNodes = 4096;
constexpr int kMaxNesting = 128;

// Keywords that say nothing about which instances are valid.
const std::set<std::string> kAnnotations = {
    "title",      "description", "default",   "examples", "$schema",     "$id",     "$comment",
    "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", "$anchor", "contentMediaType"};
const std::set<std::string> kObjectWords = {"properties", "required", "additionalProperties"};
const std::set<std::string> kArrayWords = {"items", "minItems", "maxItems"};
const std::set<std::string> kStringWords = {"minLength", "maxLength"};
const std::set<std::string> kOtherWords = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"};
const std::set<std::string> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};

bool has_any(const Json& s, const std::set<std::string>& words) {
  return std::any_of(words.begin(), words.end(), [&](const std::string& w) { return s.contains(w); });
}

bool is_type(const Json& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer();
  if (t == "boolean") return v.is_boolean();
  return v.is_null();
}

}  // namespace

class JsonSchema::Compiler {
 public:
  Compiler(const Json& root, std::string where, std::vector<Node>& nodes)
      : root_(root), where_(std::move(where)), nodes_(nodes) {}

  void compile() {
    const int32_t root = add(Kind::kAnyOf, where_);
    const int32_t body = schema(root_, where_);
    nodes_[root].branches = {body};
    first_bytes();
    heights();
    for (const Node& n : nodes_) check_branches(n);
    const int32_t h = nodes_[root].height;
    if (h == kUnreachable) {
      fail(where_,
           "the schema has no finite instance (false, or a required property or item that can only "
           "refer back to itself)");
    }
    if (h > kMaxDepth) fail(where_, fmt::format("every instance nests deeper than {} containers", kMaxDepth));
  }

 private:
  [[noreturn]] static void fail(const std::string& path, const std::string& what) {
    HLM_FAIL("{}: {}", path, what);
  }

  int32_t add(Kind kind, const std::string& path) {
    // A schema comes with a request: its size bounds the compile and the per-token work.
    if (nodes_.size() >= kMaxNodes)
      fail(where_, fmt::format("the schema compiles to more than {} nodes", kMaxNodes));
    Node n;
    n.kind = kind;
    n.path = path;
    nodes_.push_back(std::move(n));
    return static_cast<int32_t>(nodes_.size() - 1);
  }

  // Subschemas beside `keyword` may only be annotations (and `also`).
  static void alone(const Json& s, const std::string& path, const std::string& keyword,
                    const std::set<std::string>& also = {}) {
    for (const auto& [key, value] : s.items()) {
      if (key == keyword || kAnnotations.count(key) || also.count(key)) continue;
      fail(path, fmt::format("\"{}\" beside \"{}\" is not supported", key, keyword));
    }
  }

  static std::optional<uint32_t> count(const Json& s, const std::string& key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kUnbounded) {
      fail(path, fmt::format("\"{}\" must be an integer >= 0 (got {})", key, v.dump()));
    }
    return static_cast<uint32_t>(v.get<int64_t>());
  }

  static std::pair<uint32_t, uint32_t> bounds(const Json& s, const std::string& lo, const std::string& hi,
                                              const std::string& path) {
    const uint32_t min = count(s, lo, path).value_or(0);
    const uint32_t max = count(s, hi, path).value_or(kUnbounded);
    if (min > max) fail(path, fmt::format("\"{}\" {} is above \"{}\" {}", lo, min, hi, max));
    return {min, max};
  }

  int32_t schema(const Json& s, const std::string& path) {
    if (++nesting_ > kMaxNesting) fail(path, fmt::format("subschemas nest deeper than {}", kMaxNesting));
    const int32_t id = subschema(s, path);
    --nesting_;
    return id;
  }

  int32_t subschema(const Json& s, const std::string& path) {
    if (s.is_boolean())
      return s.get<bool>() ? any() : add(Kind::kAnyOf, path);  // false: no branch, no instance
    if (!s.is_object()) fail(path, fmt::format("a schema is an object or a boolean (got {})", s.dump()));
    for (const auto& [key, value] : s.items()) {
      if (kAnnotations.count(key) || kObjectWords.count(key) || kArrayWords.count(key) ||
          kStringWords.count(key) || kOtherWords.count(key)) {
        continue;
      }
      fail(path, fmt::format("\"{}\" is not supported (helixlm follows type, properties, required, "
                             "additionalProperties, items, minItems, maxItems, minLength, maxLength, enum, "
                             "const, anyOf, oneOf, a one-element allOf and $ref)",
                             key));
    }
    if (s.contains("$ref")) {
      alone(s, path, "$ref");
      if (!s["$ref"].is_string()) fail(path, "\"$ref\" must be a string");
      return ref(s["$ref"].get<std::string>(), path);
    }
    if (s.contains("allOf")) {
      alone(s, path, "allOf");
      const Json& all = s["allOf"];
      if (!all.is_array() || all.size() != 1) {
        fail(path, "\"allOf\" is supported with exactly one schema (an intersection is not)");
      }
      return schema(all[0], path + ".allOf[0]");
    }
    for (const char* word : {"anyOf", "oneOf"}) {
      if (s.contains(word)) return any_of(s, word, path);
    }
    if (s.contains("enum") || s.contains("const")) return literals(s, path);
    return typed(types(s, path), s, path);
  }

  // oneOf is anyOf here: branches that differ in their first byte cannot both match.
  int32_t any_of(const Json& s, const std::string& word, const std::string& path) {
    alone(s, path, word);
    const Json& list = s[word];
    if (!list.is_array() || list.empty()) fail(path, fmt::format("\"{}\" must be a non-empty array", word));
    const int32_t id = add(Kind::kAnyOf, path);
    for (size_t i = 0; i < list.size(); ++i) {
      const int32_t b = schema(list[i], fmt::format("{}.{}[{}]", path, word, i));
      nodes_[id].branches.push_back(b);
    }
    return id;
  }

  int32_t literals(const Json& s, const std::string& path) {
    if (s.contains("enum") && s.contains("const")) fail(path, "\"enum\" and \"const\" together");
    const std::string word = s.contains("enum") ? "enum" : "const";
    alone(s, path, word, {"type"});
    std::vector<Json> values;
    if (word == "const") {
      values.push_back(s["const"]);
    } else {
      if (!s["enum"].is_array() || s["enum"].empty()) fail(path, "\"enum\" must be a non-empty array");
      values.assign(s["enum"].begin(), s["enum"].end());
    }
    const std::vector<std::string> allowed = s.contains("type") ? types(s, path) : std::vector<std::string>{};
    const int32_t id = add(Kind::kLiterals, path);
    for (const Json& v : values) {
      if (!allowed.empty() &&
          std::none_of(allowed.begin(), allowed.end(), [&](const std::string& t) { return is_type(v, t); })) {
        continue;
      }
      nodes_[id].literals.push_back(v.dump());
    }
    std::vector<std::string>& l = nodes_[id].literals;
    if (l.empty()) fail(path, fmt::format("no value of \"{}\" is of the schema's \"type\"", word));
    std::sort(l.begin(), l.end());
    l.erase(std::unique(l.begin(), l.end()), l.end());
    return id;
  }

  // The schema's types: "type" (a name or a list), else what its keywords imply, else every type.
  static std::vector<std::string> types(const Json& s, const std::string& path) {
    std::vector<std::string> out;
    if (s.contains("type")) {
      const Json& t = s["type"];
      const Json list = t.is_array() ? t : Json::array({t});
      for (const Json& name : list) {
        if (!name.is_string() || !kTypes.count(name.get<std::string>())) {
          fail(path, fmt::format("\"type\" names object, array, string, number, integer, boolean or null "
                                 "(got {})",
                                 name.dump()));
        }
        if (std::find(out.begin(), out.end(), name.get<std::string>()) == out.end()) {
          out.push_back(name.get<std::string>());
        }
      }
      if (out.empty()) fail(path, "\"type\" is an empty list");
      // An integer is a number: the wider type alone keeps the branches apart.
      if (std::count(out.begin(), out.end(), "number") && std::count(out.begin(), out.end(), "integer")) {
        out.erase(std::find(out.begin(), out.end(), "integer"));
      }
      return out;
    }
    if (has_any(s, kObjectWords)) out.push_back("object");
    if (has_any(s, kArrayWords)) out.push_back("array");
    if (has_any(s, kStringWords)) out.push_back("string");
    if (out.size() > 1) fail(path, "keywords of several types without \"type\": name the type");
    return out;
  }

  int32_t typed(const std::vector<std::string>& types, const Json& s, const std::string& path) {
    if (types.empty()) return any();
    if (types.size() == 1) return one_type(types[0], s, path);
    const int32_t id = add(Kind::kAnyOf, path);
    for (const std::string& t : types) {
      const int32_t b = one_type(t, s, path);
      nodes_[id].branches.push_back(b);
    }
    return id;
  }

  int32_t one_type(const std::string& t, const Json& s, const std::string& path) {
    if (t == "object") return object(s, path);
    if (t == "array") {
      const auto [min, max] = bounds(s, "minItems", "maxItems", path);
      const int32_t items = s.contains("items") ? item_schema(s["items"], path + ".items") : any();
      const int32_t id = add(Kind::kArray, path);
      nodes_[id].items = items;
      nodes_[id].min_items = min;
      nodes_[id].max_items = max;
      return id;
    }
    if (t == "string") {
      const auto [min, max] = bounds(s, "minLength", "maxLength", path);
      const int32_t id = add(Kind::kString, path);
      nodes_[id].min_length = min;
      nodes_[id].max_length = max;
      return id;
    }
    if (t == "number" || t == "integer") {
      const int32_t id = add(Kind::kNumber, path);
      nodes_[id].integer = t == "integer";
      return id;
    }
    const int32_t id = add(Kind::kLiterals, path);
    nodes_[id].literals =
        t == "boolean" ? std::vector<std::string>{"false", "true"} : std::vector<std::string>{"null"};
    return id;
  }

  int32_t item_schema(const Json& items, const std::string& path) {
    if (items.is_array()) fail(path, "a list of item schemas (a tuple) is not supported");
    return schema(items, path);
  }

  int32_t object(const Json& s, const std::string& path) {
    const Json* props = s.contains("properties") ? &s["properties"] : nullptr;
    if (props && !props->is_object()) fail(path, "\"properties\" must be an object of schemas");
    const Json* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if (extra && !extra->is_boolean() && !extra->is_object()) {
      fail(path, "\"additionalProperties\" must be a boolean or a schema");
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      const Json& r = s["required"];
      if (!r.is_array()) fail(path, "\"required\" must be an array of property names");
      for (const Json& name : r) {
        if (!name.is_string()) fail(path, "\"required\" must be an array of property names");
        if (!props || !props->contains(name.get<std::string>())) {
          fail(path,
               fmt::format("\"required\" names \"{}\", which \"properties\" does not declare (undeclared "
                           "required properties are not supported)",
                           name.get<std::string>()));
        }
        required.insert(name.get<std::string>());
      }
    }
    const bool declared = props && !props->empty();
    const bool extra_allowed = !extra || !extra->is_boolean() || extra->get<bool>();
    if (declared && extra && extra_allowed) {
      fail(path,
           "\"additionalProperties\" beside \"properties\" must be false or absent (the output has the "
           "declared properties only)");
    }
    const int32_t id = add(Kind::kObject, path);
    if (!declared && extra_allowed) {
      const int32_t values =
          extra && extra->is_object() ? schema(*extra, path + ".additionalProperties") : any();
      nodes_[id].free_keys = true;
      nodes_[id].values = values;
      return id;
    }
    std::vector<Property> list;
    if (declared) {
      for (const auto& [key, value] : props->items()) {
        Property p;
        p.key = Json(key).dump();
        p.value = schema(value, fmt::format("{}.properties.{}", path, key));
        p.required = required.count(key) != 0;
        list.push_back(std::move(p));
      }
    }
    Node& n = nodes_[id];
    n.properties = std::move(list);
    const auto size = static_cast<uint32_t>(n.properties.size());
    n.next_required.assign(size + 1, size);
    for (uint32_t i = size; i-- > 0;)
      n.next_required[i] = n.properties[i].required ? i : n.next_required[i + 1];
    n.key_order.resize(size);
    for (uint32_t i = 0; i < size; ++i) n.key_order[i] = static_cast<int32_t>(i);
    std::sort(n.key_order.begin(), n.key_order.end(),
              [&n](int32_t a, int32_t b) { return n.properties[a].key < n.properties[b].key; });
    return id;
  }

  // Any JSON value: one node set, shared (its containers hold any values in turn).
  int32_t any() {
    if (any_ >= 0) return any_;
    any_ = add(Kind::kAnyOf, "(any value)");
    const int32_t obj = add(Kind::kObject, "(any object)");
    nodes_[obj].free_keys = true;
    nodes_[obj].values = any_;
    const int32_t arr = add(Kind::kArray, "(any array)");
    nodes_[arr].items = any_;
    const int32_t str = add(Kind::kString, "(any string)");
    const int32_t num = add(Kind::kNumber, "(any number)");
    const int32_t lit = add(Kind::kLiterals, "(true, false or null)");
    nodes_[lit].literals = {"false", "null", "true"};
    nodes_[any_].branches = {obj, arr, str, num, lit};
    return any_;
  }

  int32_t ref(const std::string& target, const std::string& path) {
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#') {
      fail(path,
           fmt::format("\"$ref\" \"{}\": only references into this schema (\"#...\") are supported", target));
    }
    Json::json_pointer pointer;
    try {
      pointer = Json::json_pointer(target.substr(1));
    } catch (const nlohmann::json::exception&) {
      fail(path, fmt::format("\"$ref\" \"{}\" is not a JSON pointer", target));
    }
    if (!root_.contains(pointer))
      fail(path, fmt::format("\"$ref\" \"{}\" points at nothing in the schema", target));
    const std::string target_path = where_ + target;
    const int32_t id = add(Kind::kAnyOf, target_path);
    refs_[target] = id;
    const int32_t body = schema(root_.at(pointer), target_path);
    nodes_[id].branches = {body};
    return id;
  }

  // The bytes each node may begin with; anyOf nodes take their branches', to a fixed point (refs cycle).
  void first_bytes() {
    for (Node& n : nodes_) {
      switch (n.kind) {
        case Kind::kObject:
          n.first.set('{');
          break;
        case Kind::kArray:
          n.first.set('[');
          break;
        case Kind::kString:
          n.first.set('"');
          break;
        case Kind::kNumber:
          n.first.set('-');
          for (char c = '0'; c <= '9'; ++c) n.first.set(static_cast<unsigned char>(c));
          break;
        case Kind::kLiterals:
          for (const std::string& l : n.literals) n.first.set(static_cast<unsigned char>(l[0]));
          break;
        case Kind::kAnyOf:
          break;
      }
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (Node& n : nodes_) {
        if (n.kind != Kind::kAnyOf) continue;
        std::bitset<256> f;
        for (int32_t b : n.branches) f |= nodes_[b].first;
        if (f != n.first) {
          n.first = f;
          changed = true;
        }
      }
    }
  }

  // The fewest containers an instance nests, from "none is finite" down to a fixed point.
  void heights() {
    auto saturate = [](int64_t h) { return static_cast<int32_t>(std::min<int64_t>(h, kUnreachable)); };
    for (bool changed = true; changed;) {
      changed = false;
      for (Node& n : nodes_) {
        int64_t h = 0;
        switch (n.kind) {
          case Kind::kObject:
            h = 1;
            for (const Property& p : n.properties) {
              if (p.required) h = std::max<int64_t>(h, 1 + nodes_[p.value].height);
            }
            break;
          case Kind::kArray:
            h = 1 + (n.min_items > 0 ? int64_t{nodes_[n.items].height} : 0);
            break;
          case Kind::kAnyOf:
            h = kUnreachable;
            for (int32_t b : n.branches) h = std::min<int64_t>(h, nodes_[b].height);
            break;
          default:
            h = 0;
        }
        const int32_t s = saturate(h);
        if (s != n.height) {
          n.height = s;
          changed = true;
        }
      }
    }
  }

  void check_branches(const Node& n) const {
    if (n.kind != Kind::kAnyOf) return;
    std::bitset<256> seen;
    for (size_t j = 0; j < n.branches.size(); ++j) {
      const std::bitset<256>& f = nodes_[n.branches[j]].first;
      if ((seen & f).none()) {
        seen |= f;
        continue;
      }
      size_t i = 0;
      while ((nodes_[n.branches[i]].first & f).none()) ++i;
      const std::bitset<256> both = nodes_[n.branches[i]].first & f;
      size_t c = 0;
      while (!both.test(c)) ++c;
      fail(n.path, fmt::format("branches {} and {} may both begin with '{}': branches that overlap are not "
                               "supported (the first byte must decide the branch)",
                               i, j, static_cast<char>(c)));
    }
  }

  const Json& root_;
  std::string where_;
  std::vector<Node>& nodes_;
  std::map<std::string, int32_t> refs_;
  int32_t any_ = -1;
  int nesting_ = 0;
};

std::shared_ptr<const JsonSchema> JsonSchema::compile(const nlohmann::ordered_json& schema,
                                                      const std::string& where) {
  auto s = std::make_shared<JsonSchema>();
  Compiler(schema, where, s->nodes_).compile();
  return s;
}

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  static const std::shared_ptr<const JsonSchema> s = compile(Json{{"type", "object"}}, "json_object");
  return s;
}

}  // namespace hlm
