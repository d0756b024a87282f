// core/op_profile (KILN_CPU_PROFILE): rows aggregate per label, the report sorts them by total time,
// its "ms in ops" line sums only the "op ..." rows (matmul's phases are inside them), weight GB/s and
// busy % come from the bytes and the threads' summed time, and a report clears the table. The same
// Table type holds KILN_CUDA_PROFILE's rows, where every row counts in the total.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/op_profile.h"

namespace kiln {
namespace {

TEST(OpProfile, AggregatesSortsAndClears) {
  setenv("KILN_CPU_PROFILE", "1", 1);  // before the first on(), which reads it once
  ASSERT_TRUE(op_profile::on());
  op_profile::add("op a", 2.0, 1e6);
  op_profile::add("op a", 1.0, 1e6);
  op_profile::add("op b", 6.0);
  op_profile::add("  mm phase", 1.5, 0, 2.0, 2);
  const std::string r = op_profile::report("step");
  EXPECT_EQ(r.rfind("step: 9.000 ms in ops\n", 0), 0u) << r;
  const size_t b = r.find("| op b |"), a = r.find("| op a |"), ph = r.find("|   mm phase |");
  ASSERT_NE(b, std::string::npos) << r;
  ASSERT_NE(a, std::string::npos) << r;
  ASSERT_NE(ph, std::string::npos) << r;
  EXPECT_LT(b, a);   // 6 ms before 3 ms
  EXPECT_LT(a, ph);  // before 1.5 ms
  // op a: 2 calls, 3 ms (33.3 % of 9), 1500 us a call, 2e6 bytes in 3 ms = 0.7 GB/s.
  EXPECT_NE(r.find("| op a | 2 | 3.000 | 33.3 | 1500.0 | 0.7 |  |"), std::string::npos) << r;
  // The phase: 2 ms summed over 2 threads in 1.5 ms of wall time = 67 % busy.
  EXPECT_NE(r.find("|   mm phase | 1 | 1.500 | 16.7 | 1500.0 |  | 67 |"), std::string::npos) << r;
  EXPECT_EQ(op_profile::report("again"), "");  // taken and cleared
}

TEST(OpProfile, TableWithoutPrefixTotalsEveryRow) {
  op_profile::Table t;
  EXPECT_EQ(t.report("empty"), "");
  t.add("matmul Q4_K 4096x4096 m1", 0.010, 9.4e6);
  t.add("rms_norm [4096 1 1]", 0.004);
  t.add("matmul Q4_K 4096x4096 m1", 0.010, 9.4e6);
  const std::string r = t.report("CUDA op times");
  EXPECT_EQ(r.rfind("CUDA op times: 0.024 ms in all\n", 0), 0u) << r;
  // 2 calls, 0.02 ms (83.3 % of 0.024), 10 us a call, 18.8e6 bytes in 0.02 ms = 940 GB/s.
  EXPECT_NE(r.find("| matmul Q4_K 4096x4096 m1 | 2 | 0.020 | 83.3 | 10.0 | 940.0 |  |"), std::string::npos) << r;
  EXPECT_LT(r.find("matmul"), r.find("rms_norm"));
  EXPECT_EQ(t.report("again"), "");
}

}  // namespace
}  // namespace kiln
