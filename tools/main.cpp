#include <cstdio>
int main() { std::puts("gdr: under construction"); return 0; }
