// PCRE2 compilation and matching for the Pretokenizer (see pretokenizer.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include "base/error.h"

namespace hlm {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match scratch: one ovector pair is all the splitter reads. The JIT stack is larger than
// PCRE2's 32 KiB default so that long runs (25,000 characters) never exhaust it.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);

  MatchScratch() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

}  // namespace

Pretokenizer::Pretokenizer(const std::string& pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                        &error, &offset, nullptr);
  HLM_CHECK(code_ != nullptr, "pre-tokenizer pattern does not compile at offset {}: {}", offset,
            pcre2_message(error));
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Pretokenizer::~Pretokenizer() { pcre2_code_free(code_); }

bool Pretokenizer::next(std::string_view text, size_t from, size_t* begin, size_t* end) const {
  thread_local MatchScratch scratch;
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // pcre2_jit_match skips pcre2_match's per-call checks; the subject is valid UTF-8 by contract.
  const int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), from, 0, scratch.data, scratch.context)
                      : pcre2_match(code_, subject, text.size(), from, PCRE2_NO_UTF_CHECK, scratch.data,
                                    scratch.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  HLM_CHECK(rc > 0, "pre-tokenizer match failed at byte {}: {}", from, pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
  *begin = ov[0];
  *end = ov[1];
  return true;
}

}  // namespace hlm
