/*
 * hold.exe PATH MS CONTENT: writes CONTENT (a file) to PATH and keeps PATH open for MS milliseconds
 * without FILE_SHARE_DELETE, as an antivirus scanner or backup agent would, so renames and deletes of
 * it fail with a sharing violation meanwhile. Prints "holding" once the file is in place. Used only
 * by ci/windows-e2e.sh under Wine.
 */
#include <windows.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: hold.exe PATH MS CONTENT\n");
        return 2;
    }
    char content[4096];
    FILE *in = fopen(argv[3], "rb");
    if (!in) {
        perror("content");
        return 2;
    }
    size_t n = fread(content, 1, sizeof content, in);
    fclose(in);
    HANDLE h = CreateFileA(argv[1], GENERIC_WRITE, FILE_SHARE_READ, NULL, CREATE_ALWAYS,
                           FILE_ATTRIBUTE_NORMAL, NULL);
    if (h == INVALID_HANDLE_VALUE) {
        fprintf(stderr, "CreateFile failed: %lu\n", GetLastError());
        return 1;
    }
    DWORD written = 0;
    WriteFile(h, content, (DWORD)n, &written, NULL);
    FlushFileBuffers(h);
    printf("holding\n");
    fflush(stdout);
    Sleep((DWORD)atoi(argv[2]));
    CloseHandle(h);
    return 0;
}
