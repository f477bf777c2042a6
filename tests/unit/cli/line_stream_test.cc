// LineStream: generate's output is one line per prompt in prompt order, written as tokens come.
#include "cli/line_stream.h"

#include <gtest/gtest.h>

#include <sstream>

namespace hlm {
namespace {

TEST(LineStream, StreamsTheFirstUnfinishedLineAndKeepsOrder) {
  std::ostringstream out;
  LineStream s(out, 3);
  s.token(0, 5);
  s.token(1, 7);
  s.token(0, 6);
  EXPECT_EQ(out.str(), "5,6");  // prompt 0 streams; prompt 1 waits behind it
  s.token(2, 9);
  s.done(2);  // a later prompt may finish first
  s.token(1, 8);
  EXPECT_EQ(out.str(), "5,6");
  s.done(0);
  EXPECT_EQ(out.str(), "5,6\n7,8");  // prompt 1 catches up and streams on
  s.token(1, 1);
  EXPECT_EQ(out.str(), "5,6\n7,8,1");
  s.done(1);
  EXPECT_EQ(out.str(), "5,6\n7,8,1\n9\n");
  s.finish();
  EXPECT_EQ(out.str(), "5,6\n7,8,1\n9\n");
}

TEST(LineStream, FinishCompletesEveryLineOfAnInterruptedRun) {
  std::ostringstream out;
  LineStream s(out, 3);
  s.token(0, 1);
  s.token(2, 3);
  s.finish();
  EXPECT_EQ(out.str(), "1\n\n3\n");  // prompt 1 had produced nothing: its line is empty
}

}  // namespace
}  // namespace hlm
