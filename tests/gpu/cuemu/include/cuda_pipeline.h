/* cuemu stand-in for the CUDA header of this name (cp.async is in cuemu.h) */
#include "cuemu.h"
