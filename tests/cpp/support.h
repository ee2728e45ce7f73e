#pragma once
// Test support (placeholder, filled in by the reference work).
