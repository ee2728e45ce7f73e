// Eigen's dense module, for the sources that run its matrix products. GCC 12 reports
// -Wmaybe-uninitialized inside its own AVX-512 intrinsics (_mm512_undefined_ps in avx512fintrin.h)
// once Eigen's packet code is inlined into a matrix product; the -isystem include does not silence
// warnings raised after inlining. That warning (-Wuninitialized in the sanitizer build) is turned
// off for the text of Eigen and the intrinsics it pulls in; every other warning stays on.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // the same, at -O2 with the sanitizers
#endif
#include <Eigen/Dense>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
