/*
 * A stand-in for Windows' bcryptprimitives.dll, for Wine 8.0 (Debian 12), which lacks it.
 *
 * Every Windows binary built by Rust 1.78 or later imports ProcessPrng from bcryptprimitives.dll
 * for std's random numbers (HashMap seeds). Without the DLL such a binary exits with status 53
 * before main. This DLL exports ProcessPrng and fills the buffer with RtlGenRandom
 * (SystemFunction036 in advapi32), which Wine has. It is used only by ci/windows.sh, to run the
 * test suite under Wine; it is never shipped.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG chunk = length > 0x7fffffff ? 0x7fffffff : (ULONG)length;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}
