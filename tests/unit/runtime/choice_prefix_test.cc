// ChoicePrefix against a list of strings: every prefix of a choice is accepted and only whole choices are
// complete; a choice that a longer one extends is complete and may still grow; and ConstrainedOutput lets
// the end and the longer choice's next token through at that point.
#include "runtime/choice_prefix.h"

#include <gtest/gtest.h>

#include "allowed_ids.h"
#include "base/error.h"
#include "runtime/output_constraint.h"

namespace hlm {
namespace {

TEST(ChoicePrefix, AcceptsPrefixesOfTheChoicesAndCompletesOnWholeOnes) {
  const auto choices = make_choices({"yes, twice", "no", "yes", "no"}, "choice");
  EXPECT_EQ(*choices, (Choices{"no", "yes", "yes, twice"}));  // sorted, unique
  ChoicePrefix p(*choices);
  EXPECT_FALSE(p.complete());
  EXPECT_FALSE(ChoicePrefix(p).feed('x'));
  ASSERT_TRUE(p.feed("ye"));
  EXPECT_FALSE(p.complete());
  ASSERT_TRUE(p.feed('s'));
  EXPECT_TRUE(p.complete());
  EXPECT_TRUE(p.extends());
  EXPECT_FALSE(ChoicePrefix(p).feed('!'));
  ASSERT_TRUE(p.feed(", twice"));
  EXPECT_TRUE(p.complete());
  EXPECT_FALSE(p.extends());
  EXPECT_FALSE(p.feed(' '));
  ChoicePrefix q(*choices);
  ASSERT_TRUE(q.feed("no"));
  EXPECT_TRUE(q.complete());
  EXPECT_FALSE(q.extends());
}

TEST(ChoicePrefix, RefusesEmptyListsAndEmptyChoicesNamingThem) {
  EXPECT_THROW(make_choices({}, "guided_choice"), Error);
  try {
    make_choices({"a", ""}, "guided_choice");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("guided_choice[1]: an empty choice"), std::string::npos) << e.what();
  }
}

TEST(ConstrainedOutput, AWholeChoiceThatALongerOneExtendsMayEndOrGoOn) {
  // Ids: 0 "yes", 1 ",", 2 " twice", 3 "no", 4 "y", 5 the end.
  OutputConstraint c;
  c.vocab =
      std::make_shared<ConstraintVocab>(std::vector<std::string>{"yes", ",", " twice", "no", "y", "<end>"},
                                        std::vector<uint8_t>{1, 1, 1, 1, 1, 0});
  c.choice = make_choices({"no", "yes", "yes, twice"}, "choice");
  ConstrainedOutput out(c, /*end_ids=*/{5});
  auto allowed = [&out] { return allowed_ids(out, 6); };
  EXPECT_EQ(allowed(), (std::vector<int32_t>{0, 3, 4}));
  out.observe(0);
  EXPECT_EQ(allowed(), (std::vector<int32_t>{1, 5}));  // end here, or go on to "yes, twice"
  out.observe(1);
  EXPECT_EQ(allowed(), (std::vector<int32_t>{2}));
  out.observe(2);
  EXPECT_EQ(allowed(), (std::vector<int32_t>{5}));
}

}  // namespace
}  // namespace hlm
