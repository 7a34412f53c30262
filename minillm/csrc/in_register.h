// Keeping a vector in a register inside the products' register-blocked tiles.
#pragma once

namespace minillm {

// An empty asm statement that claims to change v: the compiler must hold v in a register and
// cannot fold its load into each use as a memory operand (which GCC otherwise does in a
// tile, loading every weight or activation vector once per use instead of once).
template <typename Vector>
inline void keep_in_register(Vector& v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+x"(v));
#endif
}

}  // namespace minillm
