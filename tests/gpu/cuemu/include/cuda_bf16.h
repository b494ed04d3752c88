/* cuemu stand-in for the CUDA header of this name */
#include "cuemu.h"
