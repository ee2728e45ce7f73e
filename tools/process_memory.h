// Resident memory of this process, for the memory columns of `gdr demo` and bench/cpu_paths
// (Linux /proc; getrusage as the fallback for the peak).
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace gdr::process {

// Current resident set (/proc/self/statm), bytes.
inline double rss_bytes() {
  std::ifstream f("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  f >> pages_total >> pages_resident;
  return double(pages_resident) * double(sysconf(_SC_PAGESIZE));
}

// Peak RSS of this process (VmHWM of /proc/self/status). Not getrusage's ru_maxrss: after
// fork + exec that also counts the parent's resident set at the time of the fork.
inline double peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;  // kB
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) * 1024.0;
}

}  // namespace gdr::process
