// Umbrella header: everything a C++ caller of gdr needs.
#pragma once

#include "gdr/api.h"
#include "gdr/error.h"
#include "gdr/params.h"
#include "gdr/problem.h"
#include "gdr/tensor.h"
#include "gdr/types.h"
#include "gdr/version.h"
