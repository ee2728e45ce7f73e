#include <gtest/gtest.h>
#include "gdr/gdr.h"
TEST(Build, Links) { EXPECT_FALSE(gdr::to_string(gdr::DType::f32).empty()); }
